"""The page replayer of ``bench/tsdb_scale.py``: thousands of replicas from one process.

The benchmark's figures are only worth reading if each store scraped N distinct, valid
replicas whose counters move: these tests check the replayer serves exactly that (parsed with
prometheus_client's parser, not the project's own), and that what is no replica's page is
refused. No test here checks a timing.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tsdb_scale
from fleet_scale import capture_page
from prometheus_client.parser import text_string_to_metric_families

from support.wait import wait_for

pytestmark = pytest.mark.proc

REPLICAS = 5
INTERVAL_S = 0.5
BENCH = Path(__file__).resolve().parent.parent / "bench" / "tsdb_scale.py"


@pytest.fixture(scope="module")
def template() -> str:
    """A real sidecar's page, as the benchmark replays it."""
    return capture_page()[1]


@pytest.fixture(scope="module")
def replayer(template: str) -> Iterator[str]:
    with tsdb_scale.replaying(template, REPLICAS, INTERVAL_S) as (address, _):
        yield address


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def test_each_replica_is_a_distinct_valid_page(template: str, replayer: str) -> None:
    expected = len(samples(template))
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for index in range(REPLICAS):
        reply = httpx.get(f"http://{replayer}/r/{index}", timeout=10)
        assert reply.status_code == 200
        page = samples(reply.text)
        assert len(page) == expected
        assert {labels["instance"] for _, labels, _ in page} == {tsdb_scale.instance(index)}
        assert len({labels["pod"] for _, labels, _ in page}) == 1
        series = {(name, tuple(sorted(labels.items()))) for name, labels, _ in page}
        assert len(series) == expected  # no series twice on a page
        assert not series & seen  # and none shared with another replica
        seen |= series


def test_counters_grow_from_one_interval_to_the_next(replayer: str) -> None:
    def counters() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(f"http://{replayer}/r/1", timeout=10).text
        return {
            (name, tuple(sorted(labels.items()))): value
            for name, labels, value in samples(text)
            if name.endswith("_total") and value > 0
        }

    first = counters()
    assert first
    later = wait_for(lambda: (now := counters()) != first and now, "the next interval's page")
    assert all(later[key] > value for key, value in first.items())


@pytest.mark.parametrize("path", [f"/r/{REPLICAS}", "/r/x", "/r/", "/metrics", "/r/1/extra"])
def test_a_path_that_is_no_replica_is_a_404(replayer: str, path: str) -> None:
    assert httpx.get(f"http://{replayer}{path}", timeout=10).status_code == 404


def test_a_method_other_than_get_is_a_404(replayer: str) -> None:
    assert httpx.post(f"http://{replayer}/r/0", timeout=10).status_code == 404


def raw_reply(address: str, request: bytes) -> bytes:
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(200)


def test_a_head_that_is_not_http_is_a_400(replayer: str) -> None:
    assert raw_reply(replayer, b"hello there\r\n\r\n").startswith(b"HTTP/1.1 400 ")


def test_a_head_past_its_bound_is_a_431(replayer: str) -> None:
    head = b"GET /r/0 HTTP/1.1\r\nX-Fill: " + b"a" * tsdb_scale.MAX_HEAD_BYTES + b"\r\n\r\n"
    assert raw_reply(replayer, head).startswith(b"HTTP/1.1 431 ")


def test_the_replayer_still_serves_after_bad_requests(replayer: str) -> None:
    raw_reply(replayer, b"garbage\r\n\r\n")
    assert httpx.get(f"http://{replayer}/r/0", timeout=10).status_code == 200


def test_help_names_the_fleet_sizes_and_the_interval() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "--replicas" in out.stdout
    assert "--scrape-interval" in out.stdout
