"""The usage log as a Redis stream, where ``shared_state`` is set: every proxy of the fleet
appends its lines to one stream, ``<key_prefix>:usage:{log}``, that ``inferwatch report usage
--redis`` reads.

The lines, their buffer and the rule for a sink that refuses them are the file log's
(:class:`~inferwatch.proxy.usagelog.Buffered`); a flush appends the buffered lines off the
request path, one script call per ``CHUNK`` lines, each line ``XADD MAXLEN ~ maxlen``: the
stream keeps about the newest ``maxlen`` lines, its retention, so Redis never grows without
bound. The script also records, in a key of this process's own, the sequence number of the
last line it added: a batch sent again after its reply was lost (Redis took it, then the
connection dropped) adds only the lines it had not, so each request is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from redis.exceptions import RedisError

from inferwatch.proxy.usagelog import Buffered

#: the stream's key after the key prefix; the hash tag keeps the marks in its Cluster slot
STREAM = "usage:{log}"
#: lines per script call: a flush after an outage sends its backlog in calls of this size
CHUNK = 1024
#: how often the buffered lines are flushed (sooner when ``max_lines`` wait)
FLUSH_S = 0.25
#: how long a process's mark of its last line outlives its last flush
MARK_TTL_MS = 7 * 24 * 3600 * 1000

#: KEYS: the stream, this process's mark; ARGV: maxlen, the mark's TTL (ms), the sequence
#: number of the first line, the lines
APPEND = """
local done = tonumber(redis.call('GET', KEYS[2]) or '0')
local first = tonumber(ARGV[3])
local added = 0
for i = 4, #ARGV do
  if first + i - 4 > done then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'line', ARGV[i])
    added = added + 1
  end
end
redis.call('SET', KEYS[2], first + #ARGV - 4, 'PX', ARGV[2])
return added
"""


def stream_key(prefix: str) -> str:
    """The usage stream of the fleet whose keys start with ``prefix``."""
    return f"{prefix}:{STREAM}"


class UsageStream(Buffered):
    """The usage log's Redis stream (see the module docstring); :meth:`run` flushes it."""

    def __init__(
        self,
        client: Any,
        prefix: str,
        maxlen: int,
        call_bound_s: float,
        max_lines: int = 256,
        errors: dict[str, int] | None = None,
    ) -> None:
        key = stream_key(prefix)
        super().__init__(f"redis stream {key}", max_lines, errors)
        self.keys = [key, f"{key}:run:{uuid.uuid4().hex}"]
        self.maxlen = maxlen
        #: longest one script call may take before Redis counts as refusing
        self.call_bound_s = call_bound_s
        self._append = client.register_script(APPEND)
        self._wake = asyncio.Event()

    def _full(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Flush every ``FLUSH_S``, or as soon as ``max_lines`` wait."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_S):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Append the buffered lines, oldest first; the first refusal keeps the rest."""
        while self._lines:
            chunk = self._lines[:CHUNK]
            try:
                async with asyncio.timeout(self.call_bound_s):
                    await self._append(
                        keys=self.keys, args=[self.maxlen, MARK_TTL_MS, self._first, *chunk]
                    )
            except (RedisError, OSError, TimeoutError) as exc:
                self._refused(exc)
                return
            self._landed(len(chunk))

    async def close(self) -> None:
        """The last flush, at shutdown (before the client is closed)."""
        await self.flush()
        self._abandon()
