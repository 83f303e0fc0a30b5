"""Parity with the peers' dashboards: every panel of vLLM's, production-stack's,
dcgm-exporter's and llm-d's boards maps to one of ours, or ``dashboards/parity.yaml`` says why
not. Their JSON is read in place, in ``../shared/fixtures/dashboards/``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.dashboards import queries
from inferwatch.dashboards.boards import BOARDS
from support.shared import shared_path

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
PEERS = shared_path("fixtures/dashboards")
MAPPING = REPO / "dashboards" / "parity.yaml"


def peer_titles(dashboard: Mapping[str, Any]) -> list[str]:
    """Every panel title of a peer's board, rows opened (collapsed rows nest their panels)."""

    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            if panel.get("type") == "row":
                yield from walk(panel.get("panels", []))
            else:
                yield panel["title"]

    return list(walk(dashboard.get("panels", [])))


def ours() -> dict[str, set[int]]:
    generated = REPO / "dashboards" / "generated"
    return {
        name: {
            p["id"] for p in queries.panels(json.loads((generated / f"{name}.json").read_text()))
        }
        for name in BOARDS
    }


def mismatches(peers: Path, mapping: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What keeps ``mapping`` from covering the peers' boards under ``peers``, one line each."""
    found = []
    boards = ours()
    files = sorted(str(p.relative_to(peers)) for p in peers.rglob("*.json"))
    found += [f"{f}: not in parity.yaml" for f in files if f not in mapping]
    found += [f"{f}: no such peer board" for f in mapping if f not in files]
    for name in files:
        titles = peer_titles(json.loads((peers / name).read_text()))
        entries = mapping.get(name, {})
        found += [f"{name}: {t!r} twice, cannot map by title" for t in set(titles)
                  if titles.count(t) > 1]  # fmt: skip
        found += [f"{name}: {t!r} not mapped" for t in titles if t not in entries]
        found += [f"{name}: {t!r} is no panel of theirs" for t in entries if t not in titles]
        for title, entry in entries.items():
            if "none" in entry:
                if len(str(entry["none"]).split()) < 5:
                    found.append(f"{name}: {title!r}: say why there is no counterpart")
            elif entry.get("panel") not in boards.get(entry.get("board"), set()):
                found.append(f"{name}: {title!r}: no panel {entry.get('panel')} on our "
                             f"board {entry.get('board')!r}")  # fmt: skip
    return found


def test_every_peer_panel_maps_to_one_of_ours_or_says_why_not() -> None:
    mapping = yaml.safe_load(MAPPING.read_text())
    assert mismatches(PEERS, mapping) == []
    covered = [e for board in mapping.values() for e in board.values() if "none" not in e]
    assert len(covered) >= 60  # the mapping is not a list of excuses


def test_the_check_names_each_gap(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    (peers / "x").mkdir(parents=True)
    board = {"panels": [{"type": "row", "title": "r", "panels": [{"title": "Nested"}]},
                        {"title": "Known"}, {"title": "Excused"}, {"title": "Wrong"}]}  # fmt: skip
    (peers / "x" / "board.json").write_text(json.dumps(board))
    (peers / "x" / "new.json").write_text(json.dumps({"panels": []}))
    mapping = {
        "x/board.json": {
            "Known": {"board": "fleet", "panel": 1},
            "Excused": {"none": "no"},
            "Wrong": {"board": "fleet", "panel": 999},
            "Gone": {"board": "gpu", "panel": 1},
        },
        "x/old.json": {},
    }
    assert mismatches(peers, mapping) == [
        "x/new.json: not in parity.yaml",
        "x/old.json: no such peer board",
        "x/board.json: 'Nested' not mapped",
        "x/board.json: 'Gone' is no panel of theirs",
        "x/board.json: 'Excused': say why there is no counterpart",
        "x/board.json: 'Wrong': no panel 999 on our board 'fleet'",
    ]
