"""The demo's runbook receiver: its mapping config, its tokens and its command line.

The mapping is the shipped ``runbooks/actions.yaml`` fitted to the demo fleet. Its replica
isolation rules are kept, one copy per model narrowed to that model's replicas (the GPU
alerts carry the Prometheus target's ``replica`` label but no ``model``), so that the
circuit breaker counts each model's replicas as a population of its own: at most half of
them may be taken out, so a second primary replica or the only fallback one is refused.
Rules for actions the demo has no target for (a gateway) are left out. The namespace
allow-list names the demo's namespace and ``""``, for the GPU alerts that carry none.

Two tokens are written into the work directory: the one Alertmanager sends the receiver, and
the sidecars' admin token, which the receiver's isolation action sends the sidecars.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from inferwatch.demo import topology
from inferwatch.demo.processes import INFERWATCH, Component
from inferwatch.demo.topology import Replica
from inferwatch.runbooks import config as mapping

#: file names in the work directory
CONFIG = "runbooks.yaml"
TOKEN = "runbooks.token"
SIDECAR_TOKEN = "sidecar-admin.token"
AUDIT_LOG = "runbooks-audit.jsonl"
#: the action the demo's rules keep (its sidecars are the only targets it has)
ACTION = "isolate_replica"
#: the share of a model's replicas the receiver may isolate within the breaker's window
MAX_FRACTION = 0.5


def shipped() -> dict[str, Any]:
    """The shipped mapping config as data."""
    text = resources.files("inferwatch.runbooks").joinpath("actions.yaml").read_text("utf-8")
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def document(
    sidecar_token: Path, execute: bool, replicas: Sequence[Replica] = topology.REPLICAS
) -> dict[str, Any]:
    """The demo's mapping config: the shipped isolation rules, once per model."""
    base = shipped()
    models: dict[str, list[str]] = {}
    for replica in replicas:
        models.setdefault(replica.model, []).append(replica.name)
    rules = []
    for rule in base.get("rules") or []:
        if rule["action"] != ACTION:
            continue
        for model, names in models.items():
            on_model = f'replica=~"{"|".join(map(re.escape, names))}"'
            rules.append(
                {
                    **rule,
                    "name": f"{rule['name']}-{_slug(model)}",
                    "matchers": [*rule.get("matchers", []), on_model],
                    "params": {**rule.get("params", {}), "group": model},
                }
            )
    settings = dict((base.get("actions") or {}).get(ACTION, {}))
    return {
        "execute": execute,
        "namespaces": [topology.NAMESPACE, mapping.NO_NAMESPACE],
        "breaker": {
            **base["breaker"],
            "max_fraction": MAX_FRACTION,
            "populations": {model: len(names) for model, names in models.items()},
        },
        "actions": {ACTION: {**settings, "token_file": str(sidecar_token)}},
        "rules": rules,
    }


def _slug(model: str) -> str:
    """``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b-instruct``."""
    return model.rsplit("/", 1)[-1].lower()


def write_tokens(workdir: Path) -> None:
    """A fresh random token in each of the two token files (owner-readable only)."""
    for name in (TOKEN, SIDECAR_TOKEN):
        path = workdir / name
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(24) + "\n", encoding="utf-8")


def component(workdir: Path, port: int, execute: bool) -> Component:
    """``inferwatch runbooks serve`` on loopback, with a config written into ``workdir``."""
    config = workdir / CONFIG
    chosen = document(workdir / SIDECAR_TOKEN, execute)
    mapping.parse(chosen, "the demo's runbook mapping")  # a bug here is caught before start
    config.write_text(yaml.safe_dump(chosen, sort_keys=False), encoding="utf-8")
    argv = [
        *INFERWATCH, "runbooks", "serve", "--config", str(config),
        "--listen", f"127.0.0.1:{port}", "--execute" if execute else "--dry-run",
        "--token-file", str(workdir / TOKEN), "--audit-log", str(workdir / AUDIT_LOG),
    ]  # fmt: skip
    return Component("runbooks", "", topology.url(port), "/readyz", argv)


def webhook_url(port: int) -> str:
    return topology.url(port) + "/webhook"
