"""A mapping config for a receiver outside Kubernetes: the shipped rules, and a static
inventory of the sidecars the user names, so that ``check-config`` passes without a cluster.

The shipped ``actions.yaml`` configures no inventory (in a cluster the kit's generated mapping
lists the pods), so every rule of it has no valid target on a laptop or a plain VM.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

import yaml

from inferwatch import config as layer

HEADER = (
    "# Mapping config of `inferwatch runbooks serve` for the sidecars listed below\n"
    "# (written by `inferwatch runbooks local-config`; dry-run unless --execute).\n"
)


def shipped() -> dict[str, Any]:
    """The shipped mapping config as data."""
    text = resources.files("inferwatch.runbooks").joinpath("actions.yaml").read_text("utf-8")
    document: dict[str, Any] = layer.parse(text, "inferwatch/runbooks/actions.yaml")
    return document


def document(sidecars: Sequence[str], model: str) -> str:
    """The shipped rules with ``sidecars`` (``HOST:PORT`` each, as Prometheus scrapes them)
    as the replicas' inventory, all serving ``model``. With too few replicas for the shipped
    breaker to let one out (0.34 of them), it lets one out and the file says so."""
    config = shipped()
    listed = [{"instance": address, "model": model} for address in dict.fromkeys(sidecars)]
    config["inventory"] = {"replicas": {"static": listed}}
    breaker = config.setdefault("breaker", {})
    shipped_fraction = float(breaker.get("max_fraction", 1.0))
    note = ""
    if shipped_fraction * len(listed) < 1:  # it would refuse every isolation
        breaker["max_fraction"] = 1 / len(listed)
        note = (
            f"# breaker.max_fraction {breaker['max_fraction']:g} (shipped {shipped_fraction:g}): "
            f"one of {len(listed)} replica(s) may be taken out\n"
        )
    return HEADER + note + yaml.safe_dump(config, sort_keys=False)
