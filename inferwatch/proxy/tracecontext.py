"""W3C trace context (https://www.w3.org/TR/trace-context/) checked before it is forwarded.

The engine gets a caller's ``traceparent`` and ``tracestate`` only when they are what the
recommendation's grammar allows, so that neither a 10 KB header nor a malformed one reaches
an engine that traces (and may parse them less carefully); the rest of the request goes on.
A ``traceparent`` that is not exactly one well-formed header is dropped with its
``tracestate``; a ``tracestate`` over its bounds (512 characters, 32 members) or with a
malformed member is dropped alone. Works with tracing off: nothing here imports OpenTelemetry.
"""

from __future__ import annotations

import re

TRACEPARENT, TRACESTATE = b"traceparent", b"tracestate"
#: a traceparent at most: version 00 is 55 characters; later versions may append fields
MAX_TRACEPARENT_BYTES = 512
#: a tracestate at most, all its headers together, as the recommendation lets a vendor cut
MAX_TRACESTATE_BYTES = 512
MAX_TRACESTATE_MEMBERS = 32

_PARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-[\x21-\x7e]*)?")
_KEY = rb"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
_MEMBER = re.compile(_KEY + rb"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")


def valid_traceparent(value: bytes) -> bool:
    if len(value) > MAX_TRACEPARENT_BYTES:
        return False
    match = _PARENT.fullmatch(value)
    if match is None:
        return False
    version, trace_id, parent_id, more = match.groups()
    if version == b"ff" or trace_id == b"0" * 32 or parent_id == b"0" * 16:
        return False
    return version != b"00" or more is None  # version 00 has exactly four fields


def valid_tracestate(values: list[bytes]) -> bool:
    joined = b",".join(values)
    if len(joined) > MAX_TRACESTATE_BYTES:
        return False
    members = [m for m in (part.strip(b" \t") for part in joined.split(b",")) if m]
    keys = {member.partition(b"=")[0] for member in members}
    return (
        len(members) <= MAX_TRACESTATE_MEMBERS
        and len(keys) == len(members)
        and all(_MEMBER.fullmatch(member) for member in members)
    )


def checked(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` less the trace context the grammar refuses (see the module text)."""
    parents = [value for name, value in headers if name == TRACEPARENT]
    states = [value for name, value in headers if name == TRACESTATE]
    if not parents and not states:
        return headers
    parent = len(parents) == 1 and valid_traceparent(parents[0])
    state = parent and valid_tracestate(states)
    refused = {TRACEPARENT} if not parent else set()
    if not state:
        refused.add(TRACESTATE)
    return [(name, value) for name, value in headers if name not in refused]
