"""Chargeback totals from the proxy's usage log: tenant x model x model version x period.

Cost is computed from the prices on each line (those in force when the request settled), so a
price change mid-window bills each request at its own price; a tenant is kept as logged, so a
rename or deletion mid-window leaves earlier rows under the old name. A line that is not one
of ours (bad JSON, a missing or mistyped field, over-long, cut short) is skipped and named.
The lines come from the log's files (here) or its Redis stream (:mod:`.stream`); each is
totalled by :meth:`Totals.add`, whatever it came from.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

from inferwatch.proxy.config import Price
from inferwatch.proxy.usagelog import files

MAX_LINE_BYTES = 8192
#: skipped lines named one by one; past it they are only counted
MAX_NAMED = 100
_TOKENS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens")
_PRICES = ("price_prompt", "price_cached_prompt", "price_completion")
_FORMATS = {"day": "%Y-%m-%d", "hour": "%Y-%m-%dT%H:00Z"}

Key = tuple[str, str, str, str]  # period, tenant, model, model version


#: a row's fields, in order: requests, the three token kinds, cost, seconds the proxy held them
FIELDS = ("requests", *_TOKENS, "cost", "busy_s")


@dataclass
class Totals:
    """The rows of the lines with ``start <= ts < end``, by ``by`` ("day" or "hour", UTC)."""

    start: float
    end: float
    by: str
    rows: dict[Key, list[float]] = field(default_factory=dict)  # FIELDS
    skipped: list[str] = field(default_factory=list)  # "where: why", the first MAX_NAMED
    skipped_lines: int = 0

    def skip(self, where: str) -> None:
        self.skipped_lines += 1
        if len(self.skipped) < MAX_NAMED:
            self.skipped.append(where)

    def add(self, line: bytes, where: str) -> None:
        """Total one line of the log, or skip it named by ``where`` (``file:line``, say)."""
        try:
            ts, tenant, model, version, tokens, prices, busy = _record(line)
        except (ValueError, RecursionError) as exc:
            self.skip(f"{where}: {str(exc)[:200]}")
            return
        if not self.start <= ts < self.end:
            return
        period = time.strftime(_FORMATS[self.by], time.gmtime(ts))
        prompt, cached, completion = tokens
        cost = Price(*prices).cost(prompt, cached, completion)
        cached = min(cached, prompt)
        row = self.rows.setdefault((period, tenant, model, version), [0.0] * len(FIELDS))
        for index, value in enumerate((1, prompt, cached, completion, cost, busy)):
            row[index] += value


def _record(line: bytes) -> tuple[float, str, str, str, list[int], list[float], float]:
    fields = json.loads(line)
    if not isinstance(fields, dict):
        raise ValueError("not an object")
    ts = fields.get("ts")
    names = [fields.get(k) for k in ("tenant", "model", "model_version")]
    tokens = [fields.get(k) for k in _TOKENS]
    prices = [fields.get(k) for k in _PRICES]
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise ValueError("ts missing or not a number")
    tenant, model, version = (n if isinstance(n, str) else "" for n in names)
    if not all(isinstance(n, str) for n in names):
        raise ValueError("tenant, model or model_version missing or not a string")
    counts = [t for t in tokens if type(t) is int and t >= 0]
    if len(counts) != len(_TOKENS):
        raise ValueError("a token count is not a non-negative integer")
    rates = [float(p) for p in prices if _non_negative(p)]
    if len(rates) != len(_PRICES):
        raise ValueError("a price is not a non-negative number")
    busy = fields.get("busy_s")
    if not _non_negative(busy):
        raise ValueError("busy_s missing or not a non-negative number")
    return float(ts), tenant, model, version, counts, rates, float(busy)


def _non_negative(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def total(paths: Iterable[Path], out: Totals) -> Totals:
    """``out`` with the lines of the files at ``paths`` added."""
    for path in paths:
        with path.open("rb") as handle:
            number = 0
            while line := handle.readline(MAX_LINE_BYTES + 1):
                number += 1
                if line.endswith(b"\n"):
                    out.add(line, f"{path.name}:{number}")
                    continue
                out.skip(f"{path.name}:{number}: cut short or over-long")
                while not line.endswith(b"\n") and (line := handle.readline(MAX_LINE_BYTES)):
                    pass
    return out


def periods(start: float, end: float, by: str) -> list[tuple[str, float, float]]:
    """The UTC days or hours ``[start, end)`` touches: (the rows' period name, its start and
    end, cut to the window)."""
    size = 86400 if by == "day" else 3600
    out = []
    edge = start - start % size
    while edge < end:
        name = time.strftime(_FORMATS[by], time.gmtime(edge))
        out.append((name, max(edge, start), min(edge + size, end)))
        edge += size
    return out


def report(directory: str, out: Totals) -> Totals:
    """``out`` with the lines of the usage-log files of ``directory`` added."""
    return total(files(directory), out)
