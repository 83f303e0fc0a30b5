"""The demo's alerting: the generated rules for Prometheus and the generated Alertmanager config.

Both come from the same generator as the committed files; only the input differs. The demo
reads ``alerts/demo.yaml`` on top of the defaults (short windows and ``for:`` durations, so
that a scenario's faults fire within seconds) unless given another alert config. Its
Alertmanager's page and ticket receivers send nowhere (the demo shows what reached
Alertmanager and where it is routed, read from its API); the automation receiver sends to the
demo's own runbook receiver (:mod:`inferwatch.demo.automation`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from inferwatch.alerts import alertmanager, writer
from inferwatch.mixin import config
from inferwatch.mixin import files as generated


def demo_config(path: Path | None = None) -> config.Config:
    """``path`` (default: ``alerts/demo.yaml``) on top of the defaults; raises ConfigError."""
    from inferwatch import alerts

    return config.load(path or Path(alerts.__file__).parent / "demo.yaml")


def write_rules(folder: Path, chosen: config.Config) -> list[Path]:
    """Writes the rule files Prometheus loads into ``folder``; returns their paths."""
    files = writer.render(chosen)
    rules = {name: text for name, text in files.items() if "/" not in name}  # not the CR, AM
    generated.write(folder, rules, writer.KINDS)
    return sorted(folder / name for name in rules)


def alertmanager_config(
    chosen: config.Config, automation: str | None = None, token_file: Path | None = None
) -> str:
    """The generated routing with silent receivers; ``automation`` (a webhook URL, sent
    ``token_file``'s bearer token) is where the automation receiver sends, when given."""
    settings = alertmanager.settings(chosen).silent()
    if automation is not None:
        settings = replace(
            settings,
            receivers={**settings.receivers, "automation": (automation,)},
            token_files={**settings.token_files, "automation": str(token_file or "")},
        )
    return writer.MARKER + generated.dump(alertmanager.document(settings))
