"""Panel queries as Prometheus sees them: Grafana's variables substituted the way Grafana does.

Used by ``inferwatch snapshot`` (which has no Grafana to do it) and by the checks that run
every panel's query against a real Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass(frozen=True)
class Target:
    """One query of one panel of a board."""

    panel_id: int
    panel_title: str
    ref_id: str
    expr: str
    legend: str
    instant: bool


def targets(dashboard: Mapping[str, Any]) -> Iterator[Target]:
    """Every query of every panel (rows skipped), in board order."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield Target(
                panel["id"], panel["title"], target["refId"], target["expr"],
                target.get("legendFormat", ""), bool(target.get("instant")),
            )  # fmt: skip


def panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The board's panels, rows left out (classic JSON keeps them in one flat list)."""
    return [p for p in dashboard["panels"] if p.get("type") != "row"]


def duration(seconds: float) -> str:
    """Seconds as a Prometheus duration (whole seconds, at least 1s)."""
    return f"{max(1, round(seconds))}s"


def rate_interval(step_s: float, scrape_s: float) -> float:
    """Grafana's ``$__rate_interval``: max(step + scrape interval, 4 x scrape interval)."""
    return max(step_s + scrape_s, 4 * scrape_s)


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with ``$name`` and ``${name}`` replaced from ``values``; a variable not in
    ``values`` raises KeyError (a panel naming a variable its board lacks)."""

    def replace(match: re.Match[str]) -> str:
        return values[match[1] or match[2]]

    return _VARIABLE.sub(replace, expr)


def regex_value(values: list[str]) -> str:
    """A multi-value variable as Grafana formats it for a Prometheus regex matcher."""
    escaped = [re.sub(r"[.^$*+?()\[\]{}|\\]", lambda m: "\\\\" + m[0], v) for v in values]
    return escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"
