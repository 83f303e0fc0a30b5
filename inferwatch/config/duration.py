"""Durations in Prometheus' grammar, the only one any inferwatch config or flag accepts.

``[0-9]+(ms|s|m|h|d|w|y)`` parts in descending unit order, each unit at most once
(``1h30m``, ``90s``, ``2d``), or a bare ``0``; no fractions, so ``1.5m`` is refused. A year is
365 days and a week 7, as in Prometheus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import click

__all__ = [
    "EXAMPLES",
    "MAX_DURATION_MS",
    "UNIT_MS",
    "Duration",
    "DurationParam",
]

#: milliseconds per unit, largest first (the order the grammar requires)
UNIT_MS = {"y": 31_536_000_000, "w": 604_800_000, "d": 86_400_000, "h": 3_600_000,
           "m": 60_000, "s": 1_000, "ms": 1}  # fmt: skip
#: the longest duration any config or flag may name: 10 years
MAX_DURATION_MS = 10 * UNIT_MS["y"]
_GRAMMAR = re.compile("".join(rf"(?:(?P<{u}>[0-9]+){u})?" for u in UNIT_MS) + r"\Z")
EXAMPLES = "30s, 5m, 1h30m or 2d"


@dataclass(frozen=True, order=True)
class Duration:
    """A whole number of milliseconds, parsed from and written back as Prometheus text."""

    milliseconds: int

    @classmethod
    def parse(cls, text: str) -> Duration:
        """The duration ``text`` names; ValueError with the reason when it is not one."""
        match = _GRAMMAR.match(text) if text else None
        if text == "0":
            return cls(0)
        if match is None or not any(match.groups()):
            raise ValueError(f"expected a duration such as {EXAMPLES}, got {text!r}")
        parts = {unit: n for unit, n in match.groupdict().items() if n}
        too_long = any(len(n) > 15 for n in parts.values())  # before int() of a huge string
        total = 0 if too_long else sum(int(n) * UNIT_MS[unit] for unit, n in parts.items())
        if too_long or total > MAX_DURATION_MS:
            raise ValueError(f"{text!r} is longer than the {cls(MAX_DURATION_MS)} allowed")
        return cls(total)

    @classmethod
    def of_seconds(cls, seconds: int) -> Duration:
        return cls(seconds * 1000)

    @property
    def seconds(self) -> float:
        return self.milliseconds / 1000

    def __str__(self) -> str:
        """Prometheus' own spelling: the fewest parts, largest unit first; ``0s`` for zero."""
        if self.milliseconds == 0:
            return "0s"
        parts, rest = [], self.milliseconds
        for unit, size in UNIT_MS.items():
            count, rest = divmod(rest, size)
            if count:
                parts.append(f"{count}{unit}")
        return "".join(parts)


class DurationParam(click.ParamType[Duration]):
    """A command-line flag that takes a duration, within ``minimum``..``maximum``."""

    name = "duration"

    def __init__(self, minimum: Duration | None = None, maximum: Duration | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Duration:
        if isinstance(value, Duration):
            return value
        try:
            duration = Duration.parse(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if (self.minimum is not None and duration < self.minimum) or (
            self.maximum is not None and duration > self.maximum
        ):
            low, high = self.minimum or Duration(0), self.maximum or Duration(MAX_DURATION_MS)
            self.fail(f"{duration} is outside {low}..{high}", param, ctx)
        return duration
