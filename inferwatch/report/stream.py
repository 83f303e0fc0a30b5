"""The usage log's Redis stream (:mod:`inferwatch.proxy.usagestream`), read for the report.

Entries are read with ``XRANGE`` in pages of ``PAGE``, between the stream ids (Redis's
milliseconds when a proxy appended the line) that can hold a line of the window: from
``CLOCK_SKEW_S`` before ``--from`` (a proxy's clock ahead of Redis's) to ``lateness`` after
``--to`` (a line appended late, Redis having been down when it settled). Each line is then
kept or left out by its own ``ts``, as a file's is. Every bound holds while reading: a page
is cut down on the server (a field to one byte past a line's limit, an entry to its first
two fields), and past ``max_entries`` the report stops rather than run on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from inferwatch.proxy.sharedconfig import SharedState
from inferwatch.proxy.sharedstate import connect
from inferwatch.proxy.usagestream import stream_key
from inferwatch.report.usage import MAX_LINE_BYTES, Totals

#: entries per XRANGE page (at most a few MiB, each field cut to a line's limit)
PAGE = 256
#: how far ahead of Redis's clock a proxy's may be: its lines' ``ts`` read that much later
CLOCK_SKEW_S = 300.0
#: the page, cut down on the server: ARGV start id, end id, count, bytes kept of a field
_READ = """
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[2], 'COUNT', ARGV[3])
local keep = tonumber(ARGV[4])
for _, entry in ipairs(entries) do
  local fields = entry[2]
  for i = #fields, 5, -1 do fields[i] = nil end
  for i = 1, #fields do fields[i] = string.sub(fields[i], 1, keep) end
end
return entries
"""


class TooManyEntries(Exception):
    """The stream holds more entries around the window than the report may read."""


def _bounds(out: Totals, lateness_s: float) -> tuple[str, str]:
    """The stream ids that can hold a line of ``out``'s window (see the module docstring)."""
    low = max(int((out.start - CLOCK_SKEW_S) * 1000), 0)
    return str(low), str(int((out.end + lateness_s) * 1000))


def _entry(out: Totals, where: str, fields: list[bytes]) -> None:
    if len(fields) != 2 or fields[0] != b"line":
        out.skip(f"{where}: not a usage line (expected the one field 'line')")
    elif len(fields[1]) > MAX_LINE_BYTES:
        out.skip(f"{where}: over-long")
    else:
        out.add(fields[1], where)


async def read(shared: SharedState, out: Totals, lateness_s: float, max_entries: int) -> Totals:
    """``out`` with the stream's lines added; raises TooManyEntries past ``max_entries``, and
    redis-py's errors (or OSError, TimeoutError) when Redis cannot be read."""
    client, others = connect(shared)
    try:
        key = stream_key(shared.key_prefix)
        page = client.register_script(_READ)
        low, high = _bounds(out, lateness_s)
        seen = 0
        while True:
            entries: list[Any] = await page(keys=[key], args=[low, high, PAGE, MAX_LINE_BYTES + 1])
            seen += len(entries)
            if seen > max_entries:
                raise TooManyEntries(
                    f"the stream {key} holds over {max_entries} entries around the window; "
                    "narrow it or raise --max-entries"
                )
            for entry_id, fields in entries:
                _entry(out, f"{key}:{entry_id.decode()}", fields)
            if len(entries) < PAGE:
                return out
            low = "(" + entries[-1][0].decode()
    finally:
        for closing in (client, *others):
            await closing.aclose()


def report(shared: SharedState, out: Totals, lateness_s: float, max_entries: int) -> Totals:
    return asyncio.run(read(shared, out, lateness_s, max_entries))
