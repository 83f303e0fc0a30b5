"""The receiver's state store: one state shared by every receiver, kept across restarts,
bounded, and a corrupt or unwritable one reported in one line."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.runbooks import breaker
from inferwatch.runbooks.actions.base import Step, Unit
from inferwatch.runbooks.config import Breaker
from inferwatch.runbooks.dispatch import key
from inferwatch.runbooks.state import (
    MAX_KEYS,
    DirectoryStore,
    Episode,
    State,
    StateError,
)

pytestmark = pytest.mark.unit


def step(target: str, group: str = "llama", unit: Unit = "replica") -> Step:
    return Step("isolate_replica", target, unit, group, {"isolated": True}, "test")


def test_the_state_survives_a_restart_and_the_keys_stay_bounded(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)

    def fill(state: State) -> None:
        for i in range(MAX_KEYS + 10):
            state.remember(state.seen, f"k{i}", float(i))
        episode = Episode("ab", "2026-11-30T00:00:00Z", "rule", "isolate_replica", [], ["t"])
        state.episodes[episode.id] = episode

    asyncio.run(store.transact(fill))
    again = asyncio.run(DirectoryStore(tmp_path).transact(lambda state: state))
    assert len(again.seen) == MAX_KEYS and "k0" not in again.seen and f"k{MAX_KEYS}" in again.seen
    assert [e.made for e in again.episodes.values()] == [["t"]]


def test_the_key_is_per_episode_and_action() -> None:
    base = key("ab", "2026-11-30T00:00:00Z", "isolate_replica")
    assert base != key("ab", "2026-11-30T01:00:00Z", "isolate_replica")  # a re-fire
    assert base != key("ab", "2026-11-30T00:00:00Z", "haproxy_weights")


def test_an_open_breaker_stays_open_across_a_restart(tmp_path: Path) -> None:
    config = Breaker(max_fraction=0.5, window=3600)
    sizes = {"llama": 2}

    def trip(state: State) -> bool:
        assert breaker.check(state, config, [step("a")], sizes, 0).allowed
        breaker.record(state, config, [step("a")], 0)
        return breaker.check(state, config, [step("b")], sizes, 1).allowed

    assert asyncio.run(DirectoryStore(tmp_path).transact(trip)) is False
    restarted = DirectoryStore(tmp_path)
    verdict = asyncio.run(
        restarted.transact(lambda s: breaker.check(s, config, [step("a")], sizes, 2))
    )
    assert not verdict.allowed and "open" in verdict.reason
    assert asyncio.run(restarted.transact(breaker.reset)) == ["replica llama"]


def test_the_window_forgets_old_isolations_and_counts_each_target_once() -> None:
    config = Breaker(max_fraction=0.5, window=60)
    sizes = {"llama": 4, "pool": 1}
    state = State()
    breaker.record(state, config, [step("a"), step("b")], 1000)
    assert breaker.check(state, config, [step("a")], sizes, 1000).allowed  # counted already
    assert breaker.check(state, config, [step("c"), step("d")], sizes, 1061).allowed
    assert not breaker.check(state, config, [step("x", group="unknown")], sizes, 1061).allowed
    traffic = step("t", group="pool", unit="traffic")
    assert breaker.check(state, config, [traffic], sizes, 1061).allowed  # not counted


def test_two_receivers_sharing_a_folder_lose_no_update(tmp_path: Path) -> None:
    """The read-change-write of one store never interleaves with another's (flock): two
    stores on one folder, each adding keys from its own thread, keep every key."""

    def add(start: int) -> None:
        store = DirectoryStore(tmp_path)
        for i in range(start, start + 40):
            asyncio.run(store.transact(lambda s, i=i: s.remember(s.seen, f"k{i}", float(i))))

    workers = [threading.Thread(target=add, args=(n * 40,)) for n in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    state = asyncio.run(DirectoryStore(tmp_path).transact(lambda s: s))
    assert len(state.seen) == 80


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b'{"seen": {}}',
        json.dumps(
            {"seen": {}, "applied": {}, "taken": {}, "open": {}, "episodes": [{"nope": 1}]}
        ).encode(),
    ],
    ids=["broken", "not-an-object", "missing-tables", "bad-episode"],
)
def test_a_corrupt_state_file_is_one_line(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "state.json").write_bytes(content)
    with pytest.raises(StateError, match=r"state\.json: corrupt receiver state .* move it aside"):
        DirectoryStore(tmp_path)


def test_serve_with_a_corrupt_or_unwritable_state_dir_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERWATCH_RUNBOOKS_TOKEN", "receiver-token-0123456789")
    monkeypatch.setenv("INFERWATCH_RUNBOOKS_SIDECAR_TOKEN", "sidecar-token-0123456789")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "state.json").write_text("{")
    blocked = tmp_path / "file"
    blocked.write_text("")
    audit = str(tmp_path / "audit.jsonl")
    for folder, words in ((corrupt, "corrupt receiver state"), (blocked / "x", "cannot write")):
        argv = ["runbooks", "serve", "--state-dir", str(folder), "--audit-log", audit]
        result = CliRunner().invoke(main, [*argv, "--listen", "127.0.0.1:0"])
        assert result.exit_code == 3, result.output
        assert words in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--state-configmap", "no-slash"], "expected NAMESPACE/NAME"),
        (["--state-configmap", "ns/a/b"], "expected NAMESPACE/NAME"),
        (["--state-configmap", "ns/name", "--state-dir", "x"], "give one state store"),
    ],
)
def test_a_bad_state_configmap_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], words: str
) -> None:
    monkeypatch.setenv("INFERWATCH_RUNBOOKS_TOKEN", "receiver-token-0123456789")
    monkeypatch.setenv("INFERWATCH_RUNBOOKS_SIDECAR_TOKEN", "sidecar-token-0123456789")
    audit = str(tmp_path / "audit.jsonl")
    argv = ["runbooks", "serve", "--audit-log", audit, "--listen", "127.0.0.1:0", *extra]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert words in result.output and len(result.output.strip().splitlines()) == 1
