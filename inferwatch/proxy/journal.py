"""Usage charged while the shared state was unreachable, kept until Redis has it.

One entry per settled request (tenant, the reservation it held, tokens, the window it was
spent in, a unique id). Entries are held in memory and, with ``journal_dir`` (a writable
volume; the root file system may stay read-only), appended to this process's own file there
as JSON lines, so that a proxy that dies before Redis returns leaves them to its successor.
A replay renames the files it takes first, so that lines written meanwhile go to a fresh
file, and removes each once every line reached Redis; an entry id is marked in Redis when it
is replayed, so a replay cut short and run again charges nothing twice.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from inferwatch.logs import log_event

logger = logging.getLogger("inferwatch.proxy")

#: a line longer than this is not one of ours (tenant ids are at most 128 characters)
MAX_LINE_BYTES = 4096
_TAKEN = ".replaying"


@dataclass(frozen=True)
class Entry:
    id: str
    tenant: str
    hold: str  # the reservation it releases ("" : none in Redis)
    window_ms: int
    spent_in_ms: int  # start of the window the tokens were spent in
    tokens: int


class Journal:
    def __init__(self, directory: str, proxy: str) -> None:
        self.directory = Path(directory) if directory else None
        self.path = self.directory / f"journal-{proxy}.jsonl" if self.directory else None
        self._memory: list[Entry] = []

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
            for entry in entries(path):
                await apply(entry)
            path.unlink()
        del self._memory[:held]


def entries(path: Path) -> Iterator[Entry]:
    """The entries of a journal file, read line by line; a malformed line is logged, skipped."""
    with path.open("rb") as handle:
        while line := handle.readline(MAX_LINE_BYTES + 1):
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
            except (ValueError, TypeError) as exc:
                log_event(
                    logger, logging.ERROR, "journal line skipped", path=str(path), error=str(exc)
                )
                continue
            yield entry
