"""Walking the generated boards against a real store: each variable set to a value its own
query lists, each panel's queries run over the last two minutes, a panel dead when none of
them returns a finite sample. The no-dead-panel tests run it against Prometheus and against
VictoriaMetrics (any server of the Prometheus query API: :class:`Source`)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from inferwatch.dashboards import queries
from inferwatch.demo import topology

#: the scrape interval of the stacks the boards are read from
SCRAPE_S = 2.0
#: the values the chain prefers where present: the replica the scenarios fault, and on the
#: cost board the tenant with a budget (which sends to the fallback model)
PREFER = {"model": topology.PRIMARY_MODEL, "model_version": "v1", "replica": "primary-v1"}
PREFER_ON = {"cost": {"model": topology.FALLBACK_MODEL, "tenant": "initech"}}
#: a demo scenario step that makes the fault series exist, so that every panel has one to
#: draw: a contained (restart-app, non-fatal) XID and ECC errors on the replica the variables
#: pick, and some degenerate answers
FAULTS_STEP = """  - at: 1s
    replica: primary-v1
    inject: {gpu: [{index: 0, xid: 94, ecc_sbe: 2}], degenerate: {mode: repetition, rate: 0.1}}
"""


@dataclass
class Source:
    """A Prometheus query API at ``url``."""

    url: str
    http: httpx.Client

    def query(self, expr: str) -> list[dict[str, Any]]:
        now = time.time()
        response = self.http.get(
            f"{self.url}/api/v1/query_range",
            params={"query": expr, "start": now - 120, "end": now, "step": 5},
        )
        assert response.status_code == 200, (expr, response.text)
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def label_values(self, label: str, selector: str) -> list[str]:
        response = self.http.get(
            f"{self.url}/api/v1/label/{label}/values", params={"match[]": selector}
        )
        assert response.status_code == 200, (selector, response.text)
        values: list[str] = response.json()["data"]
        return values


def preferred(board: str) -> dict[str, str]:
    return {**PREFER, **PREFER_ON.get(board, {})}


def choose_values(
    source: Source, dashboard: Mapping[str, Any], prefer: Mapping[str, str] = PREFER
) -> dict[str, str] | None:
    """Each variable set to a real value, listed by its own query with the ones before it
    substituted (the chain a user walks)."""
    values: dict[str, str] = {}
    for variable in dashboard["templating"]["list"][1:]:
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"])
        assert match, variable["query"]
        found = source.label_values(match[2], queries.substitute(match[1], values))
        if not found:
            return None
        name = variable["name"]
        chosen = prefer[name] if prefer.get(name) in found else found[0]
        values[name] = queries.regex_value([chosen])
    return values


def grafana_values(variables: Mapping[str, str]) -> dict[str, str]:
    return {**variables, "__rate_interval": queries.duration(4 * SCRAPE_S + 5),
            "__interval": "5s", "__range": "2m"}  # fmt: skip


def has_data(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(value)) for series in result for _, value in series["values"])


def dead_panels(source: Source, boards: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``board panel-id 'title'`` of each panel none of whose queries has data."""
    dead = []
    for name, dashboard in boards.items():
        chosen = choose_values(source, dashboard, preferred(name))
        if chosen is None:
            dead.append(f"{name}: a variable has no value yet")
            continue
        values = grafana_values(chosen)
        alive: dict[int, bool] = {}
        titles = {}
        for target in queries.targets(dashboard):
            titles[target.panel_id] = target.panel_title
            if not alive.get(target.panel_id):
                expr = queries.substitute(target.expr, values)
                alive[target.panel_id] = has_data(source.query(expr))
        dead += [f"{name} {pid} {titles[pid]!r}" for pid, ok in alive.items() if not ok]
    return dead
