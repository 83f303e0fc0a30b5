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
The store is input like any other: every episode is checked on read and on write, and one
that fails is skipped (a log line naming it, a count), never acted on or written back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import logging
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, get_args

import orjson

from inferwatch.logs import log_event
from inferwatch.runbooks.actions.base import Step, Unit

logger = logging.getLogger("inferwatch.runbooks")

#: idempotency keys and cooldown stamps kept (the oldest go first)
MAX_KEYS = 5000
#: episodes held at once (active, or resolved with a rollback due)
MAX_EPISODES = 256
#: the serialized state at most: it must fit a ConfigMap (1 MiB)
MAX_STATE_BYTES = 900 * 1024
#: an episode's names (fingerprint, startsAt, rule, action) and each step's fields, at most
MAX_NAME_CHARS = 1024
STATE_FILE = "state.json"
LOCK_FILE = "state.lock"
TEMPORARY_FILE = "state.tmp"

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


_EPISODE_FIELDS = {f.name: f for f in dataclasses.fields(Episode)}
_STEP_FIELDS = {f.name for f in dataclasses.fields(Step)}
_UNITS = get_args(Unit)


def _name(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_NAME_CHARS


def _step_problem(raw: Any) -> str:
    if not isinstance(raw, dict) or set(raw) != _STEP_FIELDS:
        return f"a step is not an object of {', '.join(sorted(_STEP_FIELDS))}"
    if not all(_name(raw[k]) for k in _STEP_FIELDS - {"desired"}):
        return f"a step's fields are not strings of at most {MAX_NAME_CHARS} characters"
    if raw["unit"] not in _UNITS:
        return f"a step's unit is not one of {', '.join(_UNITS)}"
    return "" if isinstance(raw["desired"], dict) else "a step's desired state is not an object"


def episode_problem(episode: Episode) -> str:
    """Why ``episode`` cannot be kept, or ``""``: what a rollback or a read-back would trip
    over later (a step without a target, a due time that is text) is refused here."""
    for name in ("fingerprint", "starts_at", "rule", "action"):
        if not _name(getattr(episode, name)):
            return f"{name} is not a string of at most {MAX_NAME_CHARS} characters"
    if not isinstance(episode.steps, list):
        return "steps is not a list"
    for raw in episode.steps:
        if problem := _step_problem(raw):
            return problem
    if not isinstance(episode.made, list) or not all(_name(t) for t in episode.made):
        return "made is not a list of targets"
    due = episode.rollback_at
    if due is not None and (type(due) not in (int, float) or not math.isfinite(due)):
        return "rollback_at is not a number of seconds"
    if not isinstance(episode.record, dict):
        return "record is not an object"
    return "" if type(episode.settled) is bool else "settled is not true or false"


def _episode(raw: Any) -> Episode | str:
    """The episode a stored object is, or why it is none."""
    if not isinstance(raw, dict):
        return "not an object"
    if unknown := sorted(set(raw) - set(_EPISODE_FIELDS)):
        return f"unknown field {str(unknown[0])[:40]!r}"
    required = {n for n, f in _EPISODE_FIELDS.items() if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}  # fmt: skip
    if missing := sorted(required - set(raw)):
        return f"missing field {missing[0]!r}"
    episode = Episode(**raw)
    return episode_problem(episode) or episode


def _label(raw: Any, index: int) -> str:
    """What names a stored episode in a log line: its id where it has one, else its place."""
    if isinstance(raw, dict):
        fingerprint, starts_at, rule = (raw.get(k) for k in ("fingerprint", "starts_at", "rule"))
        if isinstance(fingerprint, str) and isinstance(starts_at, str) and isinstance(rule, str):
            return episode_id(fingerprint, starts_at, rule)[:300]
    return f"episodes[{index}]"


@dataclass
class State:
    seen: dict[str, float] = field(default_factory=dict)  # idempotency key -> when
    applied: dict[str, float] = field(default_factory=dict)  # "action target" -> when changed
    taken: dict[str, dict[str, float]] = field(default_factory=dict)  # breaker group -> out
    open: dict[str, str] = field(default_factory=dict)  # breaker group -> why it tripped
    episodes: dict[str, Episode] = field(default_factory=dict)
    #: (episode, why) for each episode skipped on read or refused on write; never stored
    skipped: list[tuple[str, str]] = field(default_factory=list, compare=False)

    def remember(self, table: dict[str, float], key: str, when: float) -> None:
        """Set ``key`` in a bounded table, forgetting the oldest entries past :data:`MAX_KEYS`."""
        table.pop(key, None)
        table[key] = when
        while len(table) > MAX_KEYS:
            del table[next(iter(table))]

    def to_bytes(self) -> bytes:
        """The state as stored; an episode that fails its checks is dropped, into ``skipped``."""
        for name, episode in list(self.episodes.items()):
            if problem := episode_problem(episode):
                del self.episodes[name]
                self.skipped.append((name[:300], problem))
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
            if not isinstance(document["episodes"], list):
                raise TypeError("episodes is not a list")
            for index, raw in enumerate(document["episodes"]):
                episode = _episode(raw)
                if isinstance(episode, str):
                    state.skipped.append((_label(raw, index), episode))
                else:
                    state.episodes[episode.id] = episode
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
            raise StateError(
                f"{where}: corrupt receiver state ({type(exc).__name__}: {str(exc)[:120]}); "
                "move it aside to start from an empty state"
            ) from None
        return state


def report_skipped(state: State, where: str) -> int:
    """One line for each episode a transaction skipped; how many there were."""
    for episode, reason in state.skipped:
        log_event(
            logger, logging.WARNING, "state episode skipped",
            where=where, episode=episode, reason=reason,
        )  # fmt: skip
    return len(state.skipped)


def _floats(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise TypeError("expected an object")
    return {str(k): float(v) for k, v in raw.items()}


class StateStore(Protocol):
    """Where the state lives; every read and change goes through :meth:`transact`."""

    where: str
    #: episodes skipped on read or refused on write, since the store was made
    skipped_episodes: int

    async def transact(self, change: Callable[[State], T]) -> T:
        """Run ``change`` on the current state and keep what it did, atomically with respect
        to every other receiver sharing the store; raises :class:`StateError`."""
        ...


class MemoryStore:
    """The state of one process, gone with it (``--state-dir`` unset, and tests)."""

    where = "memory"
    skipped_episodes = 0  # nothing is read back: its episodes are the ones the code made

    def __init__(self) -> None:
        self.state = State()

    async def transact(self, change: Callable[[State], T]) -> T:
        return change(self.state)


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}  # fmt: skip


def _not_regular(path: Path, kind: str) -> StateError:
    return StateError(f"{path}: not a regular file ({kind}); remove it to let the receiver make it")


def _open_regular(path: Path, flags: int) -> int:
    """A descriptor on ``path`` only if it is a regular file: a link planted there is not
    followed (``O_NOFOLLOW``), and a FIFO or a device does not block the open
    (``O_NONBLOCK``); both are refused. ``FileNotFoundError`` passes through."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_regular(path, "a symbolic link") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):  # a directory, a FIFO nobody reads
            kind = "a directory" if exc.errno == errno.EISDIR else "a FIFO"
            raise _not_regular(path, kind) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, _KINDS.get(stat.S_IFMT(mode), "not a file"))
    os.set_blocking(fd, True)
    return fd


class DirectoryStore:
    """``state.json`` in a folder, shared by every receiver that names the same folder."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / STATE_FILE
        self.where = str(self.path)
        self.skipped_episodes = 0
        self._lock_path = folder / LOCK_FILE
        self._temporary = folder / TEMPORARY_FILE
        os.close(self._lock())  # writable, or fail
        if State.from_bytes(self._read(), self.where).skipped:  # corrupt: found at start
            self._transact(lambda state: None)  # and the bad episodes gone, said once

    async def transact(self, change: Callable[[State], T]) -> T:
        return await asyncio.to_thread(self._transact, change)

    def _lock(self) -> int:
        try:
            return _open_regular(self._lock_path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise StateError(f"{self._lock_path}: cannot open: {exc.strerror or exc}") from None

    def _transact(self, change: Callable[[State], T]) -> T:
        lock = self._lock()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            before = self._read()
            state = State.from_bytes(before, self.where)
            result = change(state)
            after = state.to_bytes()
            if after != before:
                self._write(after)
            self.skipped_episodes += report_skipped(state, self.where)
            return result
        finally:
            os.close(lock)  # and the flock with it

    def _read(self) -> bytes:
        try:
            fd = _open_regular(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise StateError(f"{self.where}: cannot read: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as file:
            try:
                return file.read(MAX_STATE_BYTES + 1)
            except OSError as exc:
                raise StateError(f"{self.where}: cannot read: {exc.strerror or exc}") from None

    def _write(self, data: bytes) -> None:
        """Under the lock: a fresh temporary file (``O_EXCL``: never one planted there, link
        or not), fsync'd, renamed over the state, and the folder fsync'd."""
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._temporary)  # a link is removed, never followed
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(self._temporary, flags, 0o600), "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(self._temporary, self.path)
            folder = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except OSError as exc:
            raise StateError(f"{self.where}: cannot write: {exc.strerror or exc}") from None
