"""Usage charged while the shared state was unreachable, kept until Redis has it.

One entry per settled request (tenant, the reservation it held, tokens, the window it was
spent in, a unique id). Entries are held in memory and, with ``journal_dir`` (a writable
volume; the root file system may stay read-only), appended to this process's own file there
as JSON lines, so that a proxy that dies before Redis returns leaves them to its successor.
A replay renames the files it takes first, so that lines written meanwhile go to a fresh
file, and removes each once every line reached Redis; an entry id is marked in Redis when it
is replayed, so a replay cut short and run again charges nothing twice.

A journal file is read back from a volume, so every line is checked before it reaches
Redis (:func:`fault`): a line no proxy of this fleet could have written (a negative or
outsized charge, a tenant the config does not name, a window the tenant's budget does not
have) is skipped, counted and logged with its file and line number, never replayed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from inferwatch.logs import log_event
from inferwatch.proxy.config import Tenant
from inferwatch.proxy.usage import TEMPLATE_ALLOWANCE

logger = logging.getLogger("inferwatch.proxy")

#: a line longer than this is not one of ours (tenant ids are at most 128 characters)
MAX_LINE_BYTES = 4096
_TAKEN = ".replaying"
#: a reservation's id (``<proxy>:<sequence>``), and the id of an entry that held none
_HOLD = re.compile(r"^[0-9a-f]{12}:[0-9]{1,20}$")
_ID = re.compile(r"^[0-9a-f]{32}$")
#: a window may start this far ahead of this proxy's clock (the writer's clock was ahead)
CLOCK_SKEW_MS = 300_000
#: what an entry of a tenant without a budget may carry (charged nowhere; bounded all the same)
MAX_UNBUDGETED_TOKENS = 10**9


@dataclass(frozen=True)
class Entry:
    id: str
    tenant: str
    hold: str  # the reservation it releases ("" : none in Redis)
    window_ms: int
    spent_in_ms: int  # start of the window the tokens were spent in
    tokens: int


def fault(entry: Entry, tenants: Mapping[str, Tenant], now_ms: int) -> str:
    """Why ``entry`` cannot be one a proxy with these tenants wrote ("" : it can be)."""
    tenant = tenants.get(entry.tenant)
    if tenant is None:
        return f"tenant {entry.tenant[:130]!r} is not in the config"
    if entry.hold and not _HOLD.match(entry.hold):
        return "hold is not a reservation id"
    if (entry.id != entry.hold) if entry.hold else not _ID.match(entry.id):
        return "id is not the entry's own"
    budget = tenant.budget
    window_ms = round(budget.window_seconds * 1000) if budget is not None else 0
    if entry.window_ms != window_ms:
        return f"window_ms {entry.window_ms} is not the tenant's budget window ({window_ms})"
    spent_in = entry.spent_in_ms
    if window_ms == 0 and spent_in != -1:
        return "spent_in_ms of a tenant without a budget is not -1"
    if window_ms and (spent_in < 0 or spent_in % window_ms or spent_in > now_ms + CLOCK_SKEW_MS):
        return f"spent_in_ms {spent_in} is no window start up to now"
    most = (
        budget.tokens + budget.tolerance + TEMPLATE_ALLOWANCE  # no request is charged more
        if budget is not None
        else MAX_UNBUDGETED_TOKENS
    )
    if not 0 <= entry.tokens <= most:
        return f"tokens {entry.tokens} outside 0..{most}"
    return ""


def _anything(entry: Entry) -> str:
    return ""


class Journal:
    def __init__(
        self, directory: str, proxy: str, check: Callable[[Entry], str] = _anything
    ) -> None:
        """``check`` says why an entry read back must not be replayed ("" : replay it)."""
        self.directory = Path(directory) if directory else None
        self.path = self.directory / f"journal-{proxy}.jsonl" if self.directory else None
        self.check = check
        self._memory: list[Entry] = []
        #: lines skipped on replay (malformed, or failing ``check``)
        self.skipped = 0

    @property
    def pending(self) -> int:
        """Entries this process journaled and has not replayed yet."""
        return len(self._memory)

    def write(self, entry: Entry) -> None:
        self._memory.append(entry)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(asdict(entry), separators=(",", ":")) + "\n")

    def _files(self) -> list[Path]:
        if self.directory is None:
            return []
        return sorted(self.directory.glob("journal-*.jsonl*"))

    def has_entries(self) -> bool:
        return bool(self._memory) or bool(self._files())

    async def replay(self, apply: Callable[[Entry], Awaitable[None]]) -> None:
        """``apply`` each entry once; what ``apply`` fails on stays for the next replay."""
        if self.directory is None:
            while self._memory:
                await apply(self._memory[0])
                self._memory.pop(0)
            return
        taken = []
        for path in self._files():
            target = (
                path
                if path.suffix == _TAKEN
                else path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}{_TAKEN}")
            )
            if target != path:
                os.replace(path, target)
            taken.append(target)
        held = len(self._memory)  # all of them are in the files taken
        for path in taken:
            for entry in entries(path, self.check, self._skip):
                await apply(entry)
            path.unlink()
        del self._memory[:held]

    def _skip(self) -> None:
        self.skipped += 1


def entries(
    path: Path, check: Callable[[Entry], str] = _anything, skip: Callable[[], None] = lambda: None
) -> Iterator[Entry]:
    """The entries of a journal file, read line by line; a malformed line, or one ``check``
    finds fault with, is logged with its number, ``skip``ped."""
    with path.open("rb") as handle:
        number = 0
        while line := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            whole = line.endswith(b"\n") or len(line) <= MAX_LINE_BYTES
            while not line.endswith(b"\n") and (rest := handle.readline(MAX_LINE_BYTES)):
                line = rest  # skip the rest of an over-long line
            try:
                if not whole:
                    raise ValueError(f"line over {MAX_LINE_BYTES} bytes")
                fields = json.loads(line)
                entry = Entry(**fields)
                if not all(
                    isinstance(getattr(entry, name), kind)
                    for name, kind in (("id", str), ("tenant", str), ("hold", str))
                ) or not all(
                    type(getattr(entry, name)) is int
                    for name in ("window_ms", "spent_in_ms", "tokens")
                ):
                    raise ValueError("a field has the wrong type")
                why = check(entry)
                if why:
                    raise ValueError(why)
            except (ValueError, TypeError, RecursionError) as exc:
                skip()
                log_event(
                    logger,
                    logging.ERROR,
                    "journal line skipped",
                    path=str(path),
                    line=number,
                    error=str(exc)[:300],
                )
                continue
            yield entry
