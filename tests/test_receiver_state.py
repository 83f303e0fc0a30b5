"""The receiver's state store: one state shared by every receiver, kept across restarts,
bounded, and a corrupt or unwritable one reported in one line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.drill.kubefake import FakeKube
from inferwatch.runbooks import breaker
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks.actions.base import Alert, Step, Unit
from inferwatch.runbooks.actions.kubernetes_api import connect
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.config import Breaker
from inferwatch.runbooks.dispatch import Dispatcher
from inferwatch.runbooks.episodes import key
from inferwatch.runbooks.kube_state import ConfigMapStore
from inferwatch.runbooks.server import Receiver
from inferwatch.runbooks.state import (
    MAX_KEYS,
    DirectoryStore,
    Episode,
    State,
    StateError,
)
from support.wait import wait_for, wait_until

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
        b'{"seen": {}, "applied": {}, "taken": {}, "open": {}, "episodes": {"a": 1}}',
    ],
    ids=["broken", "not-an-object", "missing-tables", "episodes-not-a-list"],
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


def store_within(folder: Path, deadline: float = 10) -> DirectoryStore | Exception:
    """The store on ``folder``, or what opening it raised, within a deadline: a store that
    blocks (on a FIFO, say) fails the wait instead of hanging the test."""
    done: list[DirectoryStore | Exception] = []

    def open_it() -> None:
        try:
            store = DirectoryStore(folder)
            asyncio.run(store.transact(lambda s: s.remember(s.seen, "k", 1.0)))
            done.append(store)
        except Exception as exc:
            done.append(exc)

    threading.Thread(target=open_it, daemon=True).start()
    return wait_for(lambda: done[0] if done else None, "the state store opened or refused",
                    deadline)  # fmt: skip


def test_a_planted_temporary_file_link_is_not_followed(tmp_path: Path) -> None:
    """``state.tmp`` linked to a file elsewhere: the write makes a file of its own there."""
    folder, victim = tmp_path / "state", tmp_path / "victim"
    folder.mkdir()
    victim.write_bytes(b"precious")
    (folder / "state.tmp").symlink_to(victim)
    assert isinstance(store_within(folder), DirectoryStore)
    assert victim.read_bytes() == b"precious"
    assert (folder / "state.json").is_file() and not (folder / "state.json").is_symlink()
    assert json.loads((folder / "state.json").read_bytes())["seen"] == {"k": 1.0}


def plant(path: Path, kind: str, outside: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(outside)


@pytest.mark.parametrize("name", ["state.json", "state.lock"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_a_state_file_that_is_not_a_regular_file_is_refused_in_one_line(
    tmp_path: Path, name: str, kind: str
) -> None:
    """A FIFO would block the receiver's open for ever, a link would write elsewhere."""
    folder, outside = tmp_path / "state", tmp_path / "elsewhere.json"
    folder.mkdir()
    plant(folder / name, kind, outside)
    refused = store_within(folder)
    assert isinstance(refused, StateError), refused
    assert str(refused).startswith(f"{folder / name}: not a regular file")
    assert "\n" not in str(refused)
    assert not outside.exists()


def test_serve_on_a_state_fifo_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERWATCH_RUNBOOKS_TOKEN", "receiver-token-0123456789")
    monkeypatch.setenv("INFERWATCH_RUNBOOKS_SIDECAR_TOKEN", "sidecar-token-0123456789")
    os.mkfifo(tmp_path / "state.json")
    argv = ["runbooks", "serve", "--state-dir", str(tmp_path), "--listen", "127.0.0.1:0",
            "--audit-log", str(tmp_path / "audit.jsonl")]  # fmt: skip
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 3, result.output
    assert "not a regular file (a FIFO)" in result.output
    assert len(result.output.strip().splitlines()) == 1


GOOD_STEP = {
    "action": "isolate_replica",
    "target": "sidecar http://10.0.0.5:9400",
    "unit": "replica",
    "group": "llama",
    "desired": {"isolated": True},
    "reason": "x",
}
GOOD = {"fingerprint": "aa", "starts_at": "2026-11-30T00:00:00Z", "rule": "isolate",
        "action": "isolate_replica", "steps": [GOOD_STEP], "made": [GOOD_STEP["target"]],
        "rollback_at": 1000.0, "record": {"alertname": "X"}, "settled": True}  # fmt: skip
#: one of each way an episode can be wrong, each a fingerprint of its own
MALFORMED: dict[str, Any] = {
    "not-an-object": 7,
    "unknown-field": {"surprise": 1},
    "missing-field": {},
    "fingerprint": {"fingerprint": 5},
    "long-rule": {"rule": "r" * 100_000},
    "steps-not-a-list": {"steps": {"target": "x"}},
    "step-not-an-object": {"steps": [1]},
    "step-without-target": {"steps": [{k: v for k, v in GOOD_STEP.items() if k != "target"}]},
    "step-unit": {"steps": [{**GOOD_STEP, "unit": "planet"}]},
    "step-desired": {"steps": [{**GOOD_STEP, "desired": "isolated"}]},
    "made": {"made": [None]},
    "rollback-at-text": {"rollback_at": "soon"},
    "rollback-at-bool": {"rollback_at": True},
    "record": {"record": ["x"]},
    "settled": {"settled": "yes"},
}


def malformed(name: str) -> Any:
    change = MALFORMED[name]
    if not isinstance(change, dict):
        return change
    episode = {**GOOD, "fingerprint": name, **change}
    return {k: v for k, v in episode.items() if name != "missing-field" or k != "steps"}


def test_each_malformed_episode_is_skipped_counted_and_named_and_not_written_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tables = {"seen": {"k": 1.0}, "applied": {}, "taken": {}, "open": {}}
    episodes = [GOOD, *(malformed(name) for name in MALFORMED)]
    (tmp_path / "state.json").write_bytes(json.dumps({**tables, "episodes": episodes}).encode())
    with caplog.at_level(logging.WARNING, "inferwatch.runbooks"):
        store = DirectoryStore(tmp_path)
        state = asyncio.run(store.transact(lambda s: s))
    assert list(state.episodes) == ["aa|2026-11-30T00:00:00Z|isolate"]
    assert state.seen == {"k": 1.0}  # the rest of the state is kept
    assert store.skipped_episodes == len(MALFORMED)
    skipped = [r.__dict__["inferwatch_fields"] for r in caplog.records
               if r.getMessage() == "state episode skipped"]  # fmt: skip
    assert len(skipped) == len(MALFORMED)  # once each: the first read wrote the state back
    named = {f["episode"].split("|")[0] for f in skipped}
    by_place = {"episodes[1]", "episodes[4]"}  # no id to name them by: their place
    assert named == set(MALFORMED) - {"not-an-object", "fingerprint"} | by_place
    assert all(f["reason"] and len(f["episode"]) <= 300 for f in skipped)
    kept = json.loads((tmp_path / "state.json").read_bytes())
    assert [e["fingerprint"] for e in kept["episodes"]] == ["aa"]


def test_an_episode_made_malformed_is_refused_on_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = DirectoryStore(tmp_path)

    def spoil(state: State) -> None:
        for raw in (GOOD, malformed("step-unit")):
            episode = Episode(**raw)
            state.episodes[episode.id] = episode

    with caplog.at_level(logging.WARNING, "inferwatch.runbooks"):
        asyncio.run(store.transact(spoil))
    kept = json.loads((tmp_path / "state.json").read_bytes())
    assert [e["fingerprint"] for e in kept["episodes"]] == ["aa"]
    assert store.skipped_episodes == 1
    (line,) = [r.__dict__["inferwatch_fields"] for r in caplog.records
               if r.getMessage() == "state episode skipped"]  # fmt: skip
    assert line["episode"].startswith("step-unit|") and "unit" in line["reason"]


def test_the_skipped_episodes_are_a_metric(tmp_path: Path) -> None:
    tables = {"seen": {}, "applied": {}, "taken": {}, "open": {}}
    episodes = [GOOD, malformed("settled"), malformed("made")]
    (tmp_path / "state.json").write_bytes(json.dumps({**tables, "episodes": episodes}).encode())
    config = mapping.parse({"namespaces": [""], "breaker": {"max_fraction": 0.5}})
    audit = AuditLog(tmp_path / "audit.jsonl")
    dispatcher = Dispatcher(config, {}, audit, execute=False, store=DirectoryStore(tmp_path))
    app = Receiver(dispatcher, "receiver-token-0123456789").app()

    async def scrape() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as http:
            return (await http.get("/metrics")).text

    text = asyncio.run(scrape())
    assert "inferwatch_runbooks_state_episodes_skipped_total 2.0" in text.splitlines()


@pytest.mark.parametrize(
    "value", [5, None, "{", "[]"], ids=["a-number", "null", "broken", "not-an-object"]
)
def test_a_configmap_of_garbage_is_one_line_wherever_the_receiver_reads_it(
    tmp_path: Path, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The webhook's alert, the rollback ticker and the admin routes each say it in one
    line (an audit record, a log line, a 503): no traceback, no 500."""
    fake = FakeKube()
    with fake.serve() as url:
        fake.add_configmap("inferwatch", "receiver", {"state.json": value})
        api = connect(url)
        store = ConfigMapStore(api, "inferwatch", "receiver")
        with pytest.raises(StateError, match=r"^configmap inferwatch/receiver: .*$"):
            asyncio.run(store.transact(lambda s: s))
        config = mapping.parse({"namespaces": [""], "breaker": {"max_fraction": 0.5},
                                "rules": [{"name": "r", "alertname": "X",
                                           "action": "isolate_replica"}]})  # fmt: skip
        audit = AuditLog(tmp_path / "audit.jsonl")
        dispatcher = Dispatcher(config, {}, audit, execute=False, store=store)
        app = Receiver(dispatcher, "receiver-token-0123456789").app()
        alert = Alert("resolved", {"alertname": "X"}, {}, "2026-12-01T09:00:00Z",
                      "0001-01-01T00:00:00Z", "ab")  # fmt: skip

        async def exercise() -> list[httpx.Response]:
            await dispatcher.handle_one(alert, {})
            worker = asyncio.create_task(dispatcher.run())  # its resume, then its ticker
            said = {"cannot read the pending rollbacks", "rollbacks and read-backs failed"}
            await wait_until(lambda: said <= {r.getMessage() for r in caplog.records},
                             "the worker's resume and ticker failing", 10)  # fmt: skip
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            headers = {"authorization": "Bearer receiver-token-0123456789"}
            async with httpx.AsyncClient(transport=transport, base_url="http://rx") as http:
                return [await http.get("/metrics"),
                        await http.get("/admin/breaker", headers=headers)]  # fmt: skip

        with caplog.at_level(logging.DEBUG):
            answers = asyncio.run(exercise())
    assert [r.status_code for r in answers] == [503, 503], [r.text for r in answers]
    assert all("configmap inferwatch/receiver" in r.json()["error"] for r in answers)
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    (record,) = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert record["outcome"] == "error" and "configmap inferwatch/receiver" in record["reason"]
