"""The simulator's admin endpoint and server: strict fault documents, clean clears, no stalls.

A fault document is applied all or nothing: any value that is not a finite number in range
(NaN and Infinity included, which Python's json module would accept) gets a 4xx and leaves
every fault as it was. Clearing faults brings every metric a fault moved back to where it was.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.serving import listen
from inferwatch.sim.server import SimHandle, run_in_thread, start_subprocess
from inferwatch.sim.simulator import SimConfig

pytestmark = pytest.mark.proc

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
GPUS = 2  # engine_ranks=2, one GPU each


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    config = SimConfig(port=0, speed=50, admin_token=TOKEN, engine_ranks=2, seed=3)
    with run_in_thread(config) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(sim: SimHandle) -> Iterator[httpx.Client]:
    """One kept-alive client (a new httpx client per request costs more than the request)."""
    with httpx.Client(base_url=sim.url, headers=AUTH) as client:
        yield client


def post(client: httpx.Client, body: bytes) -> httpx.Response:
    return client.post("/admin/faults", content=body)


def state(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/admin/faults")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def clear(client: httpx.Client) -> None:
    assert client.delete("/admin/faults").status_code == 200


# --------------------------------------------------------------------------------------------
# Fault documents: each field drawn as a (value, usable) pair, so the test knows the verdict
# --------------------------------------------------------------------------------------------

Field = tuple[Any, bool]
NOT_FINITE = [math.nan, math.inf, -math.inf]


def numbers(low: float, high: float) -> st.SearchStrategy[Field]:
    good = st.floats(low, high, allow_nan=False).map(lambda v: (v, True))
    bad = st.sampled_from(
        [*NOT_FINITE, low - 1, high + 1, high * 1e6 + 1, 10**400, "1", None, True, [1]]
    ).map(lambda v: (v, False))
    return good | bad


def whole(low: int, high: int) -> st.SearchStrategy[Field]:
    good = st.integers(low, high).map(lambda v: (v, True))
    bad = st.sampled_from([*NOT_FINITE, low - 1, high + 1, 0.5, 1e300, 10**400, "0", False]).map(
        lambda v: (v, False)
    )
    return good | bad


def flags() -> st.SearchStrategy[Field]:
    return st.booleans().map(lambda v: (v, True)) | st.sampled_from([1, "true", None]).map(
        lambda v: (v, False)
    )


def degenerate() -> st.SearchStrategy[Field]:
    modes = ["repetition", "empty", "wrong_script", "wrong_answer"]
    plain = st.sampled_from([*modes, None]).map(lambda v: (v, True))
    bad_mode = st.sampled_from(
        ["shouting", 3, ["empty"], {"mode": "loud"}, {"rate": 0.5, "mode": 7}]
    ).map(lambda v: (v, False))

    @st.composite
    def spelled_out(draw: st.DrawFn) -> Field:
        rate, ok = draw(numbers(0, 1))
        extra = draw(st.booleans())
        spec = {"mode": draw(st.sampled_from(modes)), "rate": rate}
        if extra:
            spec["bogus"] = 1
        return spec, ok and not extra

    return plain | bad_mode | spelled_out()


@st.composite
def gpu_events(draw: st.DrawFn) -> Field:
    fields = {
        "index": whole(0, GPUS - 1),
        "xid": whole(0, 999),
        "ecc_sbe": whole(0, 1_000_000),
        "ecc_dbe": whole(0, 1_000_000),
        "remapped_uncorrectable": whole(0, 1_000_000),
        "remap_pending": flags(),
    }
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=4))
    event, usable = {}, True
    for name in chosen:
        event[name], ok = draw(fields[name])
        usable &= ok
    return event, usable


@st.composite
def documents(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    fields = {
        "slow_factor": numbers(0.01, 10_000),
        "error_rate": numbers(0, 1),
        "kv_exhaustion": numbers(0, 1),
        "hang": flags(),
        "degenerate": degenerate(),
    }
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, min_size=1))
    document, usable = {}, True
    for name in chosen:
        document[name], ok = draw(fields[name])
        usable &= ok
    if draw(st.booleans()):
        events = draw(st.lists(gpu_events(), max_size=3))
        document["gpu"] = [event for event, _ in events]
        usable &= all(ok for _, ok in events)
    return document, usable


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=documents())
def test_a_fault_document_is_applied_all_or_nothing(
    client: httpx.Client, case: tuple[dict[str, Any], bool]
) -> None:
    document, usable = case
    clear(client)
    post(client, b'{"slow_factor": 2, "error_rate": 0.25}')  # something for a bad one to spoil
    before = state(client)
    reply = post(client, json.dumps(document, allow_nan=True).encode())  # NaN, Infinity tokens
    after = state(client)
    if usable:
        assert reply.status_code == 200, reply.text
        for name in ("slow_factor", "error_rate", "kv_exhaustion", "hang"):
            if name in document:
                assert after[name] == document[name]
    else:
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["message"]
        assert after == before
    clear(client)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"[" * 100_000 + b"]" * 100_000, 413),
        (b"[" * 20_000 + b"]" * 20_000, 400),
        (b'{"slow_factor": NaN}', 400),
        (b'{"error_rate": -Infinity}', 400),
        (b"slow_factor: 2", 400),
        (b"", 400),
    ],
    ids=["too-large", "too-deep", "nan", "minus-infinity", "yaml", "empty"],
)
def test_bodies_that_are_not_a_fault_document_are_refused(
    client: httpx.Client, body: bytes, status: int
) -> None:
    clear(client)
    before = state(client)
    reply = post(client, body)
    assert reply.status_code == status
    assert state(client) == before


# --------------------------------------------------------------------------------------------
# Clearing faults restores clean metrics
# --------------------------------------------------------------------------------------------

#: what moves by itself on an idle replica: the process, and the energy counter
_DRIFTING = ("process_", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "python_gc")


def readings(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every engine gauge and every DCGM field, by series."""
    out = {}
    for path, everything in (("/metrics", False), ("/gpu/metrics", True)):
        for family in text_string_to_metric_families(client.get(path).text):
            if not everything and family.type not in ("gauge", "unknown"):
                continue
            for sample in family.samples:
                if not sample.name.startswith(_DRIFTING):
                    out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


@st.composite
def usable_documents(draw: st.DrawFn) -> dict[str, Any]:
    document: dict[str, Any] = {}
    if draw(st.booleans()):
        document["slow_factor"] = draw(st.floats(0.5, 50))
    if draw(st.booleans()):
        document["kv_exhaustion"] = draw(st.floats(0, 1))
    if draw(st.booleans()):
        document["hang"] = draw(st.booleans())
    if draw(st.booleans()):
        document["degenerate"] = draw(st.sampled_from(["repetition", "empty"]))
    document["gpu"] = [
        {
            "index": draw(st.integers(0, GPUS - 1)),
            "xid": draw(st.sampled_from([13, 31, 48, 79, 94])),
            "ecc_sbe": draw(st.integers(0, 50)),
            "ecc_dbe": draw(st.integers(0, 5)),
            "remapped_correctable": draw(st.integers(0, 5)),
            "remapped_uncorrectable": draw(st.integers(0, 5)),
            "remap_pending": draw(st.booleans()),
            "remap_failure": draw(st.booleans()),
        }
        for _ in range(draw(st.integers(0, 2)))
    ]
    return document


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(document=usable_documents())
def test_clearing_faults_restores_clean_metrics(
    client: httpx.Client, document: dict[str, Any]
) -> None:
    clear(client)
    clean = readings(client)
    assert post(client, json.dumps(document).encode()).status_code == 200
    clear(client)
    assert readings(client) == clean


# --------------------------------------------------------------------------------------------
# The server: no Nagle/delayed-ACK stalls on kept-alive connections; no temporary folders left
# --------------------------------------------------------------------------------------------


def test_accepted_connections_have_tcp_nodelay() -> None:
    listener = listen.bind("127.0.0.1", 0)
    try:
        listener.setblocking(True)
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        with client, accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert accepted.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY only then
    finally:
        listener.close()


def test_kept_alive_requests_do_not_stall(sim: SimHandle) -> None:
    """A response sent in two writes (headers, body) waits ~40 ms for the client's delayed ACK
    when Nagle is on. ``/health`` answers in one write, so it is the yardstick: over one
    kept-alive connection, a two-write route must not take many times longer."""
    host, port = sim.url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)

    def median_time(method: str, path: str, body: bytes | None = None) -> float:
        times = []
        for _ in range(15):
            started = time.perf_counter()
            connection.request(method, path, body=body, headers=AUTH)
            response = connection.getresponse()
            response.read()
            assert response.status == 200
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    try:
        median_time("GET", "/health")  # warm up
        health = median_time("GET", "/health")
        for method, path, body in [
            ("GET", "/v1/models", None),
            ("GET", "/admin/faults", None),
            ("POST", "/admin/faults", b'{"error_rate": 0}'),
        ]:
            took = median_time(method, path, body)
            assert took < 20 * health, f"{method} {path}: {took:.4f}s vs {health:.4f}s"
    finally:
        connection.close()


def test_the_simulator_process_leaves_no_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with start_subprocess(["--speed", "50"]) as proc:
        assert proc.log.parent.parent == tmp_path
        assert httpx.get(proc.url + "/health").status_code == 200
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="did not start"):
        start_subprocess(["--engine-ranks", "0"])
    assert list(tmp_path.iterdir()) == []
