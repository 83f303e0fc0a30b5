"""One module per board; ``BOARDS`` lists them in the order they are written and linked."""

from __future__ import annotations

from collections.abc import Callable

from inferwatch.dashboards.boards import (
    cost,
    fleet,
    gateway,
    gpu,
    latency,
    quality,
    replica,
    versions,
)
from inferwatch.dashboards.panels import Board, Ctx

#: board name (file name, uid ``inferwatch-<name>``) -> builder
BOARDS: dict[str, Callable[[Ctx], Board]] = {
    "fleet": fleet.board,
    "latency": latency.board,
    "replica": replica.board,
    "gpu": gpu.board,
    "cost": cost.board,
    "quality": quality.board,
    "versions": versions.board,
    "gateway": gateway.board,
}
