"""The receiver's one state, and the one interface to the store that owns it.

Everything a decision reads and a restart must keep is here: the idempotency keys, the
cooldowns, the breaker's windows and open breakers, and the episodes (a firing alert that
acted, the steps it took, which targets it changed, and when its rollback is due). Every
change is a :meth:`StateStore.transact`: read, change, write, as one step that no other
receiver sharing the store interleaves with, so two replicas never both act on one episode
and share one breaker. Outside a cluster the store is a state directory
(:class:`DirectoryStore`: one JSON file, ``flock``'d, written to a temporary file, fsync'd and
renamed); in Kubernetes a ConfigMap (:mod:`inferwatch.runbooks.kube_state`). Both are bounded:
the oldest keys are forgotten, and a new episode is refused once :data:`MAX_EPISODES` are held.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

#: idempotency keys and cooldown stamps kept (the oldest go first)
MAX_KEYS = 5000
#: episodes held at once (active, or resolved with a rollback due)
MAX_EPISODES = 256
#: the serialized state at most: it must fit a ConfigMap (1 MiB)
MAX_STATE_BYTES = 900 * 1024
STATE_FILE = "state.json"
LOCK_FILE = "state.lock"

T = TypeVar("T")


class StateError(Exception):
    """A state that cannot be read or written; the message names where and why (one line)."""


@dataclass
class Episode:
    """One firing episode of one rule that acted: ``(fingerprint, startsAt, rule)``."""

    fingerprint: str
    starts_at: str
    rule: str
    action: str
    #: every step the episode wants (it holds these targets while active), as data
    steps: list[dict[str, Any]]
    #: the targets this episode changed (or inherited): the only ones its rollback undoes
    made: list[str] = field(default_factory=list)
    #: when its rollback is due (set once its alert resolved); None while it fires
    rollback_at: float | None = None
    #: the alert's audit fields, for the lines its rollback writes
    record: dict[str, Any] = field(default_factory=dict)
    #: its apply has finished (until then a redelivery does not read the targets back)
    settled: bool = False

    @property
    def id(self) -> str:
        return episode_id(self.fingerprint, self.starts_at, self.rule)

    @property
    def active(self) -> bool:
        return self.rollback_at is None

    def holds(self, target: str) -> bool:
        return any(step["target"] == target for step in self.steps)


def episode_id(fingerprint: str, starts_at: str, rule: str) -> str:
    return f"{fingerprint}|{starts_at}|{rule}"


@dataclass
class State:
    seen: dict[str, float] = field(default_factory=dict)  # idempotency key -> when
    applied: dict[str, float] = field(default_factory=dict)  # "action target" -> when changed
    taken: dict[str, dict[str, float]] = field(default_factory=dict)  # breaker group -> out
    open: dict[str, str] = field(default_factory=dict)  # breaker group -> why it tripped
    episodes: dict[str, Episode] = field(default_factory=dict)

    def remember(self, table: dict[str, float], key: str, when: float) -> None:
        """Set ``key`` in a bounded table, forgetting the oldest entries past :data:`MAX_KEYS`."""
        table.pop(key, None)
        table[key] = when
        while len(table) > MAX_KEYS:
            del table[next(iter(table))]

    def to_bytes(self) -> bytes:
        document = {
            "seen": self.seen,
            "applied": self.applied,
            "taken": self.taken,
            "open": self.open,
            "episodes": [vars(e) for e in self.episodes.values()],
        }
        data = orjson.dumps(document)
        if len(data) > MAX_STATE_BYTES:
            raise StateError(f"the state would exceed {MAX_STATE_BYTES} bytes")
        return data

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> State:
        if not data:
            return cls()
        if len(data) > MAX_STATE_BYTES:
            raise StateError(f"{where}: larger than {MAX_STATE_BYTES} bytes")
        try:
            document = orjson.loads(data)
            state = cls(
                seen=_floats(document["seen"]),
                applied=_floats(document["applied"]),
                taken={str(k): _floats(v) for k, v in document["taken"].items()},
                open={str(k): str(v) for k, v in document["open"].items()},
            )
            for raw in document["episodes"]:
                episode = Episode(**raw)
                if not isinstance(episode.steps, list) or not isinstance(episode.made, list):
                    raise TypeError("episode steps and made must be lists")
                state.episodes[episode.id] = episode
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
            raise StateError(
                f"{where}: corrupt receiver state ({type(exc).__name__}: {str(exc)[:120]}); "
                "move it aside to start from an empty state"
            ) from None
        return state


def _floats(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise TypeError("expected an object")
    return {str(k): float(v) for k, v in raw.items()}


class StateStore(Protocol):
    """Where the state lives; every read and change goes through :meth:`transact`."""

    where: str

    async def transact(self, change: Callable[[State], T]) -> T:
        """Run ``change`` on the current state and keep what it did, atomically with respect
        to every other receiver sharing the store; raises :class:`StateError`."""
        ...


class MemoryStore:
    """The state of one process, gone with it (``--state-dir`` unset, and tests)."""

    where = "memory"

    def __init__(self) -> None:
        self.state = State()

    async def transact(self, change: Callable[[State], T]) -> T:
        return change(self.state)


class DirectoryStore:
    """``state.json`` in a folder, shared by every receiver that names the same folder."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / STATE_FILE
        self.where = str(self.path)
        self._lock_path = folder / LOCK_FILE
        os.close(os.open(self._lock_path, os.O_WRONLY | os.O_CREAT, 0o600))  # writable, or fail
        State.from_bytes(self._read(), self.where)  # corrupt: found at start, not at an alert

    async def transact(self, change: Callable[[State], T]) -> T:
        return await asyncio.to_thread(self._transact, change)

    def _transact(self, change: Callable[[State], T]) -> T:
        with self._lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            before = self._read()
            state = State.from_bytes(before, self.where)
            result = change(state)
            after = state.to_bytes()
            if after != before:
                self._write(after)
            return result

    def _read(self) -> bytes:
        try:
            with self.path.open("rb") as file:
                data = file.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise StateError(f"{self.where}: cannot read: {exc.strerror or exc}") from None
        return data

    def _write(self, data: bytes) -> None:
        temporary = self.path.with_suffix(".tmp")
        try:
            with temporary.open("wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
            folder = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except OSError as exc:
            raise StateError(f"{self.where}: cannot write: {exc.strerror or exc}") from None
