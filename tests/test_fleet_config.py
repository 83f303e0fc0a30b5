"""The proxy's ``shared_state`` section and the journal, without a Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.exitcodes import ExitCode
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.journal import MAX_LINE_BYTES, Entry, Journal, entries
from inferwatch.proxy.sharedstate import SharedLedger, _nodes

pytestmark = pytest.mark.unit


def parse(shared: Any, **tenant: Any) -> proxy_config.ProxyConfig:
    document = {"shared_state": shared, "tenants": {"acme": {"budget": {"tokens": 10}, **tenant}}}
    return proxy_config.parse(document, "p.yaml")


@pytest.mark.parametrize(
    "url, kind",
    [
        ("redis://127.0.0.1:6379/0", "redis"),
        ("rediss://redis.example:6380", "redis"),
        ("unix:///run/redis/redis.sock?db=1", "unix"),
        ("redis+sentinel://s1:26379,s2:26379,[::1]:26379/primary/2", "sentinel"),
        ("redis+cluster://n1:6379,n2", "cluster"),
    ],
)
def test_every_documented_url_form_is_accepted(url: str, kind: str) -> None:
    shared = parse({"url": url}).shared_state
    assert shared is not None and shared.kind == kind and shared.password is None


@pytest.mark.parametrize(
    "shared, field, reason",
    [
        ({"url": "redis://:secret@h:6379/0"}, "shared_state.url", "no password in the URL"),
        ({"url": "http://h:6379"}, "shared_state.url", "expected redis://"),
        ({"url": "redis+sentinel://h:26379"}, "shared_state.url", "expected redis://"),
        ({}, "shared_state.url", "is required"),
        ({"url": "redis://h", "lease": "3s", "timeout": "1s"}, "shared_state.timeout", "sixth"),
        ({"url": "redis://h", "lease": "100ms"}, "shared_state.lease", "at least 1s"),
        ({"url": "redis://h", "password_env": "IW_NOT_SET_ANYWHERE"}, "password_env", "not set"),
        ({"url": "redis://h", "journal_dir": "/proc/none"}, "journal_dir", "not a writable"),
        ({"url": "redis://h", "failure_policy": "maybe"}, "failure_policy", "fail_closed"),
        ({"url": "redis://h", "pasword_file": "x"}, "pasword_file", "unknown field"),
    ],
)
def test_a_bad_section_names_its_field(shared: Any, field: str, reason: str) -> None:
    with pytest.raises(proxy_config.ConfigError) as error:
        parse(shared)
    assert error.value.args[0].startswith("p.yaml: ") and field in str(error.value)
    assert reason in str(error.value)


def test_the_password_comes_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    from_file = parse({"url": "redis://h", "password_file": str(secret)}).shared_state
    monkeypatch.setenv("IW_REDIS_PASSWORD", "from-env")
    from_env = parse({"url": "redis://h", "password_env": "IW_REDIS_PASSWORD"}).shared_state
    assert from_file is not None and from_file.password == "s3cret"
    assert from_env is not None and from_env.password == "from-env"
    secret.write_bytes(b"x" * 5000)
    with pytest.raises(proxy_config.ConfigError, match="over 4096 bytes"):
        parse({"url": "redis://h", "password_file": str(secret)})


def test_a_tenant_policy_overrides_the_sections() -> None:
    config = parse(
        {"url": "redis://h", "failure_policy": "fail_open"}, failure_policy="fail_closed"
    )
    ledger = SharedLedger(config)
    assert ledger.policy("acme") == "fail_closed" and ledger.policy("globex") == "fail_open"
    assert proxy_config.parse({}).shared_state is None  # no section: budgets stay in-process


def test_the_cli_says_one_line_for_a_bad_section(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(json.dumps({"shared_state": {"url": "redis://:pw@h/0"}}))
    result = CliRunner().invoke(main, ["proxy", "--config", str(path)])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "shared_state.url: no password in the URL" in result.output
    assert "Traceback" not in result.output


def test_sentinel_and_cluster_nodes_are_read_with_their_default_ports() -> None:
    assert _nodes("a:1,b,[::1]:3", 26379) == [("a", 1), ("b", 26379), ("::1", 3)]


def entry(number: int) -> Entry:
    return Entry(f"e{number}", "acme", f"h{number}", 60_000, 0, number)


def test_the_journal_replays_what_it_kept_and_keeps_what_failed(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path), "p1")
    for number in range(3):
        journal.write(entry(number))
    applied: list[str] = []

    async def fail_on_e1(item: Entry) -> None:
        if item.id == "e1" and len(applied) < 2:
            applied.append("failed")
            raise ConnectionError("redis went away again")
        applied.append(item.id)

    with pytest.raises(ConnectionError):
        asyncio.run(journal.replay(fail_on_e1))
    assert journal.has_entries() and journal.pending == 3
    journal.write(entry(3))  # written during the outage after the cut-short replay
    asyncio.run(journal.replay(fail_on_e1))
    # e0 twice (Redis marks a replayed entry and charges it once); files in any order
    assert sorted(applied) == ["e0", "e0", "e1", "e2", "e3", "failed"]
    assert not journal.has_entries() and journal.pending == 0


def test_a_journal_without_a_directory_keeps_entries_in_memory() -> None:
    journal = Journal("", "p1")
    journal.write(entry(5))
    seen: list[Entry] = []

    async def apply(item: Entry) -> None:
        seen.append(item)

    asyncio.run(journal.replay(apply))
    assert seen == [entry(5)] and not journal.has_entries()


def test_malformed_and_over_long_journal_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "journal-x.jsonl"
    good = json.dumps(entry(7).__dict__)
    path.write_text(
        "\n".join(
            [
                "{not json",
                json.dumps({**entry(1).__dict__, "tokens": "many"}),
                '{"id": "' + "x" * (MAX_LINE_BYTES * 3) + '"}',
                good,
                good[: len(good) // 2],  # a line cut short by a crash
            ]
        )
    )
    assert list(entries(path)) == [entry(7)]
