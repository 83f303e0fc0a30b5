"""Fault injection: what can go wrong with a simulated replica, and how to ask for it.

The same document is accepted from a YAML/JSON file at start-up (``--faults``) and as the body
of ``POST /admin/faults`` (keys given are changed, others kept; a document with any unusable
value changes nothing)::

    slow_factor: 4          # every engine step takes 4x as long
    error_rate: 0.2         # this share of requests is answered with HTTP 500
    degenerate: repetition  # or {mode: repetition|empty|wrong_script|wrong_answer, rate: 0.5}
                            # min_tokens: N, only completions allowed N tokens or more (their
                            # max_tokens): a loop long generations fall into, short probes miss
    hang: true              # the engines stop stepping; /health answers 503
    kv_exhaustion: 0.95     # this share of KV blocks becomes unusable (preemption, queueing)
    gpu:                    # hardware events on GPU `index` (0-based over all ranks' GPUs)
      - {index: 0, xid: 79}                    # last XID; kills the engine unless non-fatal
      - {index: 1, ecc_sbe: 10, ecc_dbe: 1}    # added to the volatile ECC counters
      - {index: 0, remapped_uncorrectable: 1, remap_pending: true, remap_failure: false}

``DELETE /admin/faults`` clears everything: the GPUs are back as they started (XID, ECC and
row-remap state), so every metric a fault moved reads as it did before the fault.

Numbers must be finite and in range (NaN and Infinity are refused, as are counts past
``MAX_COUNT``); counts, indexes and XIDs must be whole numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from inferwatch.sim.answers import DEGENERATE_MODES

#: the most one fault document may add to an ECC or remapped-row counter
MAX_COUNT = 1_000_000


class FaultError(ValueError):
    """An unusable fault document; the message names the field."""


@dataclass(frozen=True)
class Faults:
    slow_factor: float = 1.0
    error_rate: float = 0.0
    degenerate: str | None = None
    degenerate_rate: float = 1.0
    #: only requests whose max_tokens is at least this many degenerate
    degenerate_min_tokens: int = 0
    hang: bool = False
    kv_exhaustion: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "slow_factor": self.slow_factor,
            "error_rate": self.error_rate,
            "degenerate": None
            if self.degenerate is None
            else {
                "mode": self.degenerate,
                "rate": self.degenerate_rate,
                "min_tokens": self.degenerate_min_tokens,
            },
            "hang": self.hang,
            "kv_exhaustion": self.kv_exhaustion,
        }


@dataclass(frozen=True)
class GpuEvent:
    index: int
    xid: int | None = None
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool | None = None
    remap_failure: bool | None = None


def _number(data: Mapping[str, Any], key: str, low: float, high: float) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultError(f"{key} must be a number, not {value!r}")
    if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
        raise FaultError(f"{key} must be between {low} and {high}, not {value}")
    return float(value)


def _whole(data: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = _number(data, key, low, high)
    if not value.is_integer():
        raise FaultError(f"{key} must be a whole number, not {data[key]}")
    return int(value)


def _flag(data: Mapping[str, Any], key: str) -> bool:
    value = data[key]
    if not isinstance(value, bool):
        raise FaultError(f"{key} must be true or false, not {value!r}")
    return value


def _gpu_event(raw: Any, gpu_count: int) -> GpuEvent:
    if not isinstance(raw, Mapping):
        raise FaultError(f"each gpu entry must be a mapping, not {raw!r}")
    known = {"index", "xid", "ecc_sbe", "ecc_dbe", "remapped_correctable",
             "remapped_uncorrectable", "remap_pending", "remap_failure"}  # fmt: skip
    unknown = sorted(set(raw) - known)
    if unknown:
        raise FaultError(
            f"unknown gpu fault field {unknown[0]!r}; known: {', '.join(sorted(known))}"
        )
    index = _whole(raw, "index", 0, gpu_count - 1) if "index" in raw else 0

    def count(key: str) -> int:
        return _whole(raw, key, 0, MAX_COUNT) if key in raw else 0

    def flag(key: str) -> bool | None:
        return _flag(raw, key) if key in raw else None

    return GpuEvent(
        index=index,
        xid=_whole(raw, "xid", 0, 999) if "xid" in raw else None,
        ecc_sbe=count("ecc_sbe"),
        ecc_dbe=count("ecc_dbe"),
        remapped_correctable=count("remapped_correctable"),
        remapped_uncorrectable=count("remapped_uncorrectable"),
        remap_pending=flag("remap_pending"),
        remap_failure=flag("remap_failure"),
    )


def parse(data: Any, current: Faults, gpu_count: int) -> tuple[Faults, list[GpuEvent]]:
    """Apply a fault document to ``current``; returns the new faults and GPU events.

    Everything is checked before anything is returned, so a caller that applies the result
    only on success applies a document all or nothing."""
    if data is None:
        return current, []
    if not isinstance(data, Mapping):
        raise FaultError("a fault document must be a mapping of fault names to settings")
    known = {"slow_factor", "error_rate", "degenerate", "hang", "kv_exhaustion", "gpu"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise FaultError(f"unknown fault {unknown[0]!r}; known: {', '.join(sorted(known))}")
    faults = current
    if "slow_factor" in data:
        faults = replace(faults, slow_factor=_number(data, "slow_factor", 0.01, 10_000))
    if "error_rate" in data:
        faults = replace(faults, error_rate=_number(data, "error_rate", 0, 1))
    if "kv_exhaustion" in data:
        faults = replace(faults, kv_exhaustion=_number(data, "kv_exhaustion", 0, 1))
    if "hang" in data:
        faults = replace(faults, hang=_flag(data, "hang"))
    if "degenerate" in data:
        spec = data["degenerate"]
        if isinstance(spec, Mapping):
            unknown = sorted(set(spec) - {"mode", "rate", "min_tokens"})
            if unknown:
                raise FaultError(
                    f"unknown degenerate field {unknown[0]!r}; known: mode, rate, min_tokens"
                )
        mode, rate, min_tokens = (
            (spec.get("mode"), spec.get("rate", 1.0), spec.get("min_tokens", 0))
            if isinstance(spec, Mapping)
            else (spec, 1.0, 0)
        )
        if mode is not None and (not isinstance(mode, str) or mode not in DEGENERATE_MODES):
            raise FaultError(
                f"degenerate must be one of {', '.join(DEGENERATE_MODES)} or null, not {mode!r}"
            )
        rate = _number({"degenerate.rate": rate}, "degenerate.rate", 0, 1)
        least = _whole({"degenerate.min_tokens": min_tokens}, "degenerate.min_tokens", 0, 1 << 20)
        faults = replace(faults, degenerate=mode, degenerate_rate=rate, degenerate_min_tokens=least)
    raw_events = data.get("gpu", [])
    if not isinstance(raw_events, list):
        raise FaultError("gpu must be a list of {index, xid | ecc_* | remap*} entries")
    return faults, [_gpu_event(raw, gpu_count) for raw in raw_events]
