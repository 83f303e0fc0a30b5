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

from inferwatch.alerts import alertmanager, config, writer
from inferwatch.mixin import files as generated
from inferwatch.mixin import recording
from inferwatch.mixin.model import Group, Recording


def demo_config(path: Path | None = None) -> config.Config:
    """``path`` (default: ``alerts/demo.yaml``) on top of the defaults; raises ConfigError."""
    from inferwatch import alerts

    return config.load(path or Path(alerts.__file__).parent / "demo.yaml")


#: the recording rules of the default alert config, which the committed dashboards read
BOARDS_RECORDING = "boards-recording.yaml"


def write_rules(folder: Path, chosen: config.Config) -> list[Path]:
    """Writes the rule files Prometheus loads into ``folder``; returns their paths.

    Besides ``chosen``'s rules, Prometheus records the series the committed dashboards read
    that ``chosen`` does not (the default config's windows are 5m, the demo's 20s), so that
    the boards a user imports into Grafana draw against the demo as well as its own."""
    files = writer.render(chosen)
    rules = {name: text for name, text in files.items() if "/" not in name}  # not the CR, AM
    default = config.load()
    boards = _recording_besides(recording.groups(default), recording.groups(chosen))
    if boards:
        document = {"groups": [writer.group_dict(g, default) for g in boards]}
        rules[BOARDS_RECORDING] = writer.MARKER + generated.dump(document)
    generated.write(folder, rules, writer.KINDS)
    return sorted(folder / name for name in rules)


def _recording_besides(groups: list[Group], other: list[Group]) -> list[Group]:
    """``groups`` less the rules whose series ``other`` records, renamed apart from it."""
    recorded = {rule.record for group in other for rule in group.rules
                if isinstance(rule, Recording)}  # fmt: skip
    kept = []
    for group in groups:
        rules = tuple(r for r in group.rules
                      if isinstance(r, Recording) and r.record not in recorded)  # fmt: skip
        if rules:
            kept.append(replace(group, name=f"boards-{group.name}", rules=rules))
    return kept


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
