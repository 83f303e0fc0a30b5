"""The suite on several xdist workers: ``scripts/test`` runs ``-n 2 --dist loadgroup``.

A worker takes a whole test module at a time, so a module's fixtures (a demo stack, a
Prometheus, a proxy) start once and never on two workers at once; the real-engine tests share
one ``xdist_group``, and so one worker, because the engines they share are session fixtures
too heavy to run twice side by side (a vLLM on 2 cores). A test module's own ``xdist_group``
mark names any other set that must run one after another.

The units go out in the tiers' order, cheapest first, but for the groups: they go out right
after the unit tier. A group is the longest unit (the engines' start and every real-engine
test, one after another); handed out last, as its tier would have it, it ran alone at the end
while the other worker had long finished.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

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
    after the unit tier, the rest in the order the tiers sorted it."""
    if not hasattr(config, "workerinput"):
        return

    def place(item: pytest.Item) -> int:
        if item.get_closest_marker("unit"):
            return 0
        return 1 if item.get_closest_marker("xdist_group") else 2

    items.sort(key=place)  # stable
