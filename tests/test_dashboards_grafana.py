"""The boards load in the oldest Grafana they are for: every panel type and option they use
exists in Grafana 10.4, and the schema version is the one 10.4 writes.

No Grafana runs here, so the check is a table of what each version has, from Grafana's own
pull requests, changelog and docs (each row says where). An option newer than 10.4 that the
SDK writes by default is listed apart with the value it must keep: the one that behaves as
10.4 does, which ignores the key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from inferwatch.dashboards import panels, queries
from inferwatch.dashboards.boards import BOARDS

pytestmark = pytest.mark.unit

GENERATED = Path(__file__).resolve().parent.parent / "dashboards" / "generated"
OLDEST = (10, 4)
# Grafana 10.4 exports dashboards with schemaVersion 39 (grafana/grafonnet#196, "exported from
# my grafana instance ... the schema was version 39"; DashboardMigrator.ts latestVersion).
SCHEMA_VERSION = 39

V9_DOCS = "docs.aws.amazon.com/grafana/latest/userguide/v9-panels-{}.html (Grafana 9.x)"
#: panel type -> (first Grafana version, where that is said)
TYPES = {
    "row": ((5, 0), "Grafana 5.0 rows as panels (DashboardMigrator schema 16)"),
    "timeseries": ((8, 0), V9_DOCS.format("time-series")),
    "stat": ((7, 0), V9_DOCS.format("stat")),
    "table": ((7, 0), V9_DOCS.format("table")),
    # the new heatmap replaced the old one in 9.1 (grafana.com/grafana/plugins/heatmap-new)
    "heatmap": ((9, 1), "grafana.com/grafana/plugins/heatmap-new, " + V9_DOCS.format("heatmap")),
    "state-timeline": ((8, 0), V9_DOCS.format("state-timeline")),
}
#: panel type -> option path (options.* and fieldConfig.defaults custom.*/defaults.*) ->
#: (first Grafana version, where)
_LEGEND = {
    "options.legend.calcs": ((8, 0), V9_DOCS.format("time-series") + " legend values"),
    "options.legend.displayMode": ((8, 0), V9_DOCS.format("time-series") + " legend mode"),
    "options.legend.placement": ((8, 0), V9_DOCS.format("time-series") + " legend placement"),
    "options.legend.showLegend": ((9, 0), V9_DOCS.format("time-series") + " legend visibility"),
    "options.tooltip.mode": ((8, 0), V9_DOCS.format("time-series") + " tooltip mode"),
    "options.tooltip.sort": ((8, 4), V9_DOCS.format("time-series") + " tooltip values sort"),
}
_FIELD = {
    "defaults.unit": ((7, 0), V9_DOCS.format("standard-options") + " unit"),
    "defaults.min": ((7, 0), V9_DOCS.format("standard-options") + " min"),
    "defaults.max": ((7, 0), V9_DOCS.format("standard-options") + " max"),
    "defaults.thresholds": ((7, 0), V9_DOCS.format("thresholds")),
    "defaults.mappings": ((7, 0), V9_DOCS.format("value-mappings")),
    "defaults.links": ((7, 0), V9_DOCS.format("data-links")),
    "defaults.noValue": ((7, 0), V9_DOCS.format("standard-options") + " no value"),
}
OPTIONS: dict[str, dict[str, tuple[tuple[int, int], str]]] = {
    "timeseries": {
        **_LEGEND,
        **_FIELD,
        "custom.fillOpacity": ((8, 0), V9_DOCS.format("time-series") + " fill opacity"),
        "custom.stacking.mode": ((8, 0), V9_DOCS.format("time-series") + " stack series"),
        "custom.thresholdsStyle.mode": ((8, 0), V9_DOCS.format("time-series") + " show thresholds"),
    },
    "state-timeline": {
        **_LEGEND,
        **_FIELD,
        "custom.fillOpacity": ((8, 0), V9_DOCS.format("state-timeline") + " fill opacity"),
        "custom.lineWidth": ((8, 0), V9_DOCS.format("state-timeline") + " line width"),
        "options.alignValue": ((8, 0), V9_DOCS.format("state-timeline") + " align values"),
        "options.mergeValues": (
            (8, 0),
            V9_DOCS.format("state-timeline") + " merge equal consecutive values",
        ),
        "options.rowHeight": ((8, 0), V9_DOCS.format("state-timeline") + " row height"),
        "options.showValue": ((8, 0), V9_DOCS.format("state-timeline") + " show values"),
    },
    "stat": {
        **_FIELD,
        "options.colorMode": ((7, 0), V9_DOCS.format("stat") + " color mode"),
        "options.graphMode": ((7, 0), V9_DOCS.format("stat") + " graph mode"),
        "options.justifyMode": ((7, 0), V9_DOCS.format("stat") + " text alignment"),
        "options.orientation": ((7, 0), V9_DOCS.format("stat") + " orientation"),
        "options.textMode": ((7, 0), V9_DOCS.format("stat") + " text mode"),
        "options.reduceOptions.calcs": ((7, 0), V9_DOCS.format("stat") + " calculation"),
        "options.reduceOptions.values": ((7, 0), V9_DOCS.format("stat") + " show"),
        # grafana/grafana#78012, "[v10.2.x] Stat: Add panel option to control wide layout"
        "options.wideLayout": ((10, 2), "grafana/grafana#78012"),
        # grafana/grafana#78250, "Stat: Add Percent Change Option", merged 2023-12 (10.3)
        "options.showPercentChange": ((10, 3), "grafana/grafana#78250"),
    },
    "table": {
        **_FIELD,
        "custom.align": ((7, 0), V9_DOCS.format("table") + " column alignment"),
        "custom.inspect": ((8, 0), V9_DOCS.format("table") + " cell value inspect"),
        # grafana/grafana#65312: "in Grafana 9.5 we are adding cell height option (sm, md, lg)"
        "options.cellHeight": ((9, 5), "grafana/grafana#65312"),
        "options.footer.countRows": ((9, 0), V9_DOCS.format("table") + " count rows"),
        "options.footer.reducer": ((8, 0), V9_DOCS.format("table") + " table footer"),
        "options.footer.show": ((8, 0), V9_DOCS.format("table") + " table footer"),
        "options.frameIndex": ((7, 0), V9_DOCS.format("table") + " (multiple frames)"),
        "options.showHeader": ((7, 0), V9_DOCS.format("table") + " show header"),
        # grafana/grafana#38855, "Tables: optionally show field type icon", 2021-09 (8.2)
        "options.showTypeIcons": ((8, 2), "grafana/grafana#38855"),
    },
    "heatmap": {
        **_FIELD,
        "options.calculate": ((9, 0), V9_DOCS.format("heatmap") + " calculate from data"),
        "options.cellGap": ((9, 0), V9_DOCS.format("heatmap") + " cell display, gap"),
        "options.cellValues.unit": ((9, 0), V9_DOCS.format("heatmap") + " cell display, unit"),
        "options.color.exponent": ((9, 0), V9_DOCS.format("heatmap") + " colors, exponent"),
        "options.color.fill": ((9, 0), V9_DOCS.format("heatmap") + " colors, opacity colour"),
        "options.color.mode": ((9, 0), V9_DOCS.format("heatmap") + " colors, mode"),
        "options.color.reverse": ((9, 0), V9_DOCS.format("heatmap") + " colors, reverse"),
        "options.color.scale": ((9, 0), V9_DOCS.format("heatmap") + " colors, scale"),
        "options.color.scheme": ((9, 0), V9_DOCS.format("heatmap") + " colors, scheme"),
        "options.color.steps": ((9, 0), V9_DOCS.format("heatmap") + " colors, steps"),
        "options.exemplars.color": ((9, 0), V9_DOCS.format("heatmap") + " exemplars"),
        "options.filterValues.le": ((9, 0), V9_DOCS.format("heatmap") + " hide cells with values"),
        "options.legend.show": ((9, 0), V9_DOCS.format("heatmap") + " legend"),
        "options.rowsFrame.layout": ((9, 1), V9_DOCS.format("heatmap") + " Y bucket layout"),
        "options.showValue": ((9, 0), V9_DOCS.format("heatmap") + " show values"),
        "options.tooltip.mode": ((9, 0), V9_DOCS.format("heatmap") + " tooltip"),
        "options.yAxis.unit": ((9, 0), V9_DOCS.format("heatmap") + " Y axes, unit"),
    },
}
#: transformation id -> (first Grafana version, where)
TRANSFORMATIONS = {
    "merge": ((9, 0), "Grafana 9.x docs, transformation functions: Merge"),
    "organize": ((9, 0), "Grafana 9.x docs, transformation functions: Organize fields by name"),
}
#: options newer than 10.4 that the SDK always writes -> (type, version, where, the value to
#: keep: what 10.4 does without the option)
NEWER_DEFAULTS = {
    # grafana/grafana#88205 "Stat: Add percent change color modes" (11.1); read only with
    # showPercentChange, which stays false
    ("stat", "options.percentChangeColorMode"): ((11, 1), "grafana/grafana#88205", "standard"),
    # grafana/grafana#88107 adds heatmap selectionMode (11.1); "x" is the zoom 10.4 has
    ("heatmap", "options.selectionMode"): ((11, 1), "grafana/grafana#88107", "x"),
    # grafana/grafana#92257 "[v11.2.x] State timeline: Add pagination support"; the SDK
    # cannot write 0 (grafana/grafana#113651), so newer Grafanas page at 20 rows
    ("state-timeline", "options.perPage"): ((11, 2), "grafana/grafana#92257", 20),
}


def committed() -> dict[str, dict[str, Any]]:
    return {name: json.loads((GENERATED / f"{name}.json").read_text()) for name in BOARDS}


def _paths(prefix: str, value: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for key, item in value.items():
        if isinstance(item, dict) and key != "thresholds":
            yield from _paths(f"{prefix}{key}.", item)
        else:
            yield f"{prefix}{key}", item


def used_options(panel: Mapping[str, Any]) -> dict[str, Any]:
    """A panel's options and field defaults as dotted paths -> values."""
    defaults = dict(panel["fieldConfig"]["defaults"])
    custom = defaults.pop("custom", {})
    return {
        **dict(_paths("options.", panel.get("options", {}))),
        **dict(_paths("custom.", custom)),
        **{f"defaults.{key}": value for key, value in defaults.items()},
    }


def test_the_schema_version_is_the_one_the_oldest_grafana_writes() -> None:
    oldest = ".".join(map(str, OLDEST))
    assert (oldest, SCHEMA_VERSION) == (panels.GRAFANA, panels.SCHEMA_VERSION)
    for name, dashboard in committed().items():
        assert dashboard["schemaVersion"] == SCHEMA_VERSION, name


def problems(name: str, dashboard: Mapping[str, Any]) -> list[str]:
    """What in ``dashboard`` the oldest Grafana lacks, one line each."""
    found = []
    for panel in dashboard["panels"]:
        where = f"{name} panel {panel['id']} ({panel['type']})"
        if panel["type"] not in TYPES or TYPES[panel["type"]][0] > OLDEST:
            found.append(f"{where}: type not in Grafana {panels.GRAFANA}")
            continue
        if panel["type"] == "row":
            continue
        for transformation in panel.get("transformations", ()):
            known = TRANSFORMATIONS.get(transformation["id"])
            if known is None or known[0] > OLDEST:
                found.append(f"{where}: transformation {transformation['id']} not in Grafana "
                             f"{panels.GRAFANA}")  # fmt: skip
        for option, value in used_options(panel).items():
            newer = NEWER_DEFAULTS.get((panel["type"], option))
            known = OPTIONS[panel["type"]].get(option)
            if newer is not None and value != newer[2]:
                found.append(f"{where}: {option} needs Grafana {newer[0]} unless {newer[2]!r}")
            elif newer is None and (known is None or known[0] > OLDEST):
                found.append(f"{where}: {option} not in Grafana {panels.GRAFANA}")
    return found


def test_every_panel_type_and_option_exists_in_the_oldest_grafana() -> None:
    assert [p for name, d in committed().items() for p in problems(name, d)] == []


def test_the_check_refuses_what_the_oldest_grafana_lacks() -> None:
    defaults = {"unit": "short"}
    board = {"panels": [
        {"id": 1, "type": "stat", "fieldConfig": {"defaults": defaults},
         "options": {"percentChangeColorMode": "inverted", "showPercentChange": False}},
        {"id": 2, "type": "trend", "fieldConfig": {"defaults": defaults}},
        {"id": 3, "type": "timeseries", "fieldConfig": {"defaults": defaults},
         "options": {"legend": {"sortBy": "Max"}}},
        {"id": 4, "type": "table", "fieldConfig": {"defaults": defaults},
         "transformations": [{"id": "merge"}, {"id": "groupToNestedTable"}]},
    ]}  # fmt: skip
    assert problems("b", board) == [
        "b panel 1 (stat): options.percentChangeColorMode needs Grafana (11, 1) unless 'standard'",
        "b panel 2 (trend): type not in Grafana 10.4",
        "b panel 3 (timeseries): options.legend.sortBy not in Grafana 10.4",
        "b panel 4 (table): transformation groupToNestedTable not in Grafana 10.4",
    ]


def test_the_boards_draw_latency_as_heatmaps_and_readiness_as_state_timelines() -> None:
    boards = committed()
    latency = {p["id"]: p for p in queries.panels(boards["latency"])}
    assert [latency[i]["type"] for i in (15, 16, 17, 18)] == ["heatmap"] * 4
    for i in (15, 16, 17, 18):
        (target,) = latency[i]["targets"]
        assert target["format"] == "heatmap" and target["legendFormat"] == "{{le}}"
        assert target["expr"].startswith("sum by (le) (")
    assert latency[18]["targets"][0]["exemplar"] is True
    fleet = {p["id"]: p for p in queries.panels(boards["fleet"])}
    for i in (1, 2, 5):
        assert fleet[i]["type"] == "state-timeline", i
        (mapping,) = fleet[i]["fieldConfig"]["defaults"]["mappings"]
        assert {k: v["color"] for k, v in mapping["options"].items()} == {"0": "red", "1": "green"}


def test_legends_are_tables_so_long_model_names_are_not_cut() -> None:
    for name, dashboard in committed().items():
        for panel in queries.panels(dashboard):
            if panel["type"] in ("timeseries", "state-timeline"):
                assert panel["options"]["legend"]["displayMode"] == "table", (name, panel["id"])


def test_every_board_marks_version_changes_and_firing_alerts() -> None:
    for name, dashboard in committed().items():
        marks = {a["name"]: a for a in dashboard["annotations"]["list"]}
        assert set(marks) == {"Versions", "Firing alerts"}, name
        assert marks["Firing alerts"]["expr"].startswith('ALERTS{alertstate="firing"'), name
        assert " unless group by (" in marks["Versions"]["expr"], name
        variables = {v["name"] for v in dashboard["templating"]["list"]}
        for mark in marks.values():
            queries.substitute(mark["expr"], {v: ".*" for v in variables})  # no foreign $var


def test_advised_vs_running_is_one_table_of_both_queries_merged() -> None:
    """A row per model and setting with the running and the advised value side by side: the
    two instant queries' frames merged on their labels, the time column left out."""
    fleet = {p["id"]: p for p in queries.panels(committed()["fleet"])}
    panel = fleet[20]
    assert panel["type"] == "table" and panel["title"] == "Advised vs running settings"
    running, advised = panel["targets"]
    assert "inferwatch_engine_setting{" in running["expr"]
    assert "inferwatch_advise_setting{" in advised["expr"]
    for target in (running, advised):
        assert target["instant"] is True and target["format"] == "table"
        assert target["expr"].startswith("max by (cluster, model, setting) (")
        assert '"setting", "replicas"' in target["expr"]  # and the replicas as one more row
    merge, organize = panel["transformations"]
    assert merge["id"] == "merge"
    assert organize == {
        "id": "organize",
        "options": {
            "excludeByName": {"Time": True},
            "renameByName": {"Value #A": "running", "Value #B": "advised"},
        },
    }
