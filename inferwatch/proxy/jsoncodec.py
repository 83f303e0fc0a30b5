"""JSON on the request path: orjson's speed, the standard library's range, hostile input bounded.

Every request body, reply and stream event the proxy meters is parsed, and every request
writes an access-log line, so JSON is a large share of the proxy's CPU. orjson parses about
four times and serializes about ten times faster than ``json``, but it has three limits the
proxy must not pass on to clients:

* it reads an integer beyond 64 bits as a float, silently losing digits (a ``seed`` or an id
  would reach the engine changed), so text with a run of 19 or more digits is parsed by
  ``json``, which keeps integers exact;
* it rejects ``NaN``/``Infinity`` (which some engines write for log-probabilities), so what it
  refuses is parsed again by ``json``; request bodies (``finite=True``) refuse them, and any
  number that overflows a double, since they could not be written back as JSON;
* nesting: orjson stops at 1024 levels and ``json`` at the interpreter's recursion limit;
  both end as ``ValueError`` here, never as ``RecursionError``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

_LONG_DIGITS = re.compile(rb"\d{19}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} does not fit a double")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(data: bytes, *, finite: bool = False) -> Any:
    """Parse JSON text; raises ``ValueError`` for anything it cannot parse exactly."""
    if not _LONG_DIGITS.search(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # NaN, Infinity or a float out of range: json decides below
    try:
        if finite:
            return json.loads(data, parse_float=_finite_float, parse_constant=_no_constant)
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON is nested too deeply") from None


def dumps(value: Any) -> bytes:
    """Compact JSON of a parsed document; integers of any size written exactly."""
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        pass  # an integer past 64 bits, or nesting past orjson's limit
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except RecursionError:
        raise ValueError("JSON is nested too deeply to write back") from None


def dumps_line(fields: dict[str, Any]) -> str:
    """One compact JSON line (values orjson cannot encode are written with ``str``)."""
    return orjson.dumps(fields, default=str).decode()
