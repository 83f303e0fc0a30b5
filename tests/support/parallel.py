"""The suite on several xdist workers: ``scripts/test`` runs ``-n 2 --dist loadgroup``.

A worker takes a whole test module at a time, so a module's fixtures (a demo stack, a
Prometheus, a proxy) start once and never on two workers at once; the real-engine tests share
one ``xdist_group``, and so one worker, because the engines they share are session fixtures
too heavy to run twice side by side (a vLLM on 2 cores). A test module's own ``xdist_group``
mark names any other set that must run one after another.

The units go out in the tiers' order, cheapest first, but for the groups: they go out right
after the unit tier. A group is the longest unit (the engines' start and every real-engine
test, one after another); handed out last, as its tier would have it, it ran alone at the end
while the other worker had long finished. For the same reason a module marked ``long`` (one
that runs for a minute or more: a drill, a scenario played in real time) goes out first
within its tier, and the short ones fill in after it, so that the two workers finish a tier
together.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

from support.tiers import TIERS, tier_of

#: the group of every real-engine test
ENGINES = "realengine"


class ModuleScheduling(LoadGroupScheduling):
    """``loadgroup``, with every test outside a group grouped with the rest of its module,
    and the units handed out in the order collected (:func:`pytest_collection_modifyitems`)
    rather than by their number of tests."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        group = super()._split_scope(nodeid)
        return group if group != nodeid else nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ModuleScheduling | None:
    return ModuleScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


def pytest_itemcollected(item: pytest.Item) -> None:
    """A real-engine test joins the engines' group (before xdist reads the groups)."""
    if item.get_closest_marker("realengine") and not item.get_closest_marker("xdist_group"):
        item.add_marker(pytest.mark.xdist_group(ENGINES))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker (the order it collects is the order the units go out): the groups right
    after the unit tier, the rest in the order the tiers sorted it, ``long`` modules first
    within their tier."""
    if not hasattr(config, "workerinput"):
        return
    order = list(TIERS)

    def place(item: pytest.Item) -> tuple[int, int, bool]:
        if item.get_closest_marker("unit"):
            return 0, 0, False
        if item.get_closest_marker("xdist_group"):
            return 1, 0, False
        return 2, order.index(tier_of(item)), item.get_closest_marker("long") is None

    items.sort(key=place)  # stable
