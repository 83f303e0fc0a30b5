"""The sidecar against engines that send hostile or broken pages.

Each test takes a class of input (any Content-Encoding chain, any number of series, any
restart sequence of data-parallel ranks) rather than one payload: what must hold is that the
input is bounded while it is read, that what is wrong is dropped and counted, and that the
output Prometheus sees stays sound.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import math
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.exporters.engine.checks import Limits
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.serving.page_fetch import (
    INFLATE_STEP,
    EngineScraper,
    Inflater,
    ScrapeFailure,
)
from support.exposition import samples, value
from support.wait import wait_for

pytestmark = pytest.mark.unit

MiB = 1 << 20


# --------------------------------------------------------------------------------------------
# An engine that answers with whatever body and headers a test gives it
# --------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: _Engine

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.hits += 1
        time.sleep(self.server.delay)
        status, headers, body = self.server.answer
        self.send_response(status)
        for name, header_value in {"Content-Type": "text/plain; version=0.0.4", **headers}.items():
            self.send_header(name, header_value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)


class _Engine(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer: tuple[int, dict[str, str], bytes] = (200, {}, b"")
        self.delay = 0.0
        self.hits = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"


@pytest.fixture
def engine() -> Iterator[_Engine]:
    server = _Engine()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


async def get(sidecar: Sidecar, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=sidecar.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
        return await client.get(path)


# --------------------------------------------------------------------------------------------
# Compressed pages are bounded while they are inflated
# --------------------------------------------------------------------------------------------

#: Content-Encoding name -> how to apply it
ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: gzip.compress(data, mtime=0),
    "x-gzip": lambda data: gzip.compress(data, mtime=0),
    "deflate": zlib.compress,  # zlib-framed, as RFC 9110 says
    "deflate-raw": lambda data: _raw_deflate(data),  # what some servers send as "deflate"
}


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def encode(body: bytes, chain: list[str]) -> tuple[bytes, str]:
    """The body with each encoding applied in order, and its Content-Encoding header."""
    for name in chain:
        body = ENCODERS[name](body)
    return body, ", ".join("deflate" if name == "deflate-raw" else name for name in chain)


@cache
def bomb(chain: tuple[str, ...], inflated: int) -> tuple[bytes, str]:
    """``inflated`` bytes of newlines (a valid, empty page) compressed through ``chain``."""
    compressor = zlib.compressobj(9, wbits=16 + zlib.MAX_WBITS)
    block = b"\n" * MiB
    first = b"".join(compressor.compress(block) for _ in range(inflated // MiB))
    first += compressor.flush()  # gzip framing: the first layer is gzip
    assert chain[0] == "gzip"
    body, header = encode(first, list(chain[1:]))
    return body, ", ".join(filter(None, ("gzip", header)))


CHAINS = [("gzip",), ("gzip", "gzip"), ("gzip", "deflate"), ("gzip", "deflate-raw", "gzip")]


@pytest.mark.parametrize("chain", CHAINS, ids=[", ".join(c) for c in CHAINS])
def test_a_small_page_that_inflates_past_the_cap_is_refused_within_a_small_multiple(
    engine: _Engine, chain: tuple[str, ...]
) -> None:
    body, header = bomb(chain, 64 * MiB)
    assert len(body) < MiB // 8, "the bomb is small on the wire"
    engine.answer = (200, {"Content-Encoding": header}, body)
    scraper = EngineScraper(engine.url, timeout_s=10, max_bytes=MiB)

    async def scrape() -> ScrapeFailure:
        try:
            with pytest.raises(ScrapeFailure) as failure:
                await scraper.fetch()
            return failure.value
        finally:
            await scraper.aclose()

    tracemalloc.start()
    try:
        failure = asyncio.run(scrape())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert failure.reason == "too_large"
    assert peak < 3 * MiB, f"peak {peak / MiB:.1f} MiB while refusing a 1 MiB-capped page"


@st.composite
def chains(draw: st.DrawFn) -> list[str]:
    return draw(st.lists(st.sampled_from(sorted(ENCODERS)), min_size=0, max_size=3))


@settings(max_examples=60, deadline=None)
@given(
    chain=chains(),
    body=st.binary(max_size=4096) | st.builds(lambda n: b"vllm:x 1\n" * n, st.integers(0, 40_000)),
    cut=st.integers(1, 5000),
)
def test_any_encoding_chain_inflates_exactly_in_bounded_steps(
    chain: list[str], body: bytes, cut: int
) -> None:
    encoded, header = encode(body, chain)
    inflater = Inflater(header)
    pieces = [
        piece
        for start in range(0, len(encoded), cut)
        for piece in inflater.feed(encoded[start : start + cut])
    ]
    assert b"".join(pieces) == body
    assert all(len(piece) <= INFLATE_STEP for piece in pieces)


@pytest.mark.parametrize(
    ("header", "body"),
    [
        ("br", b"\x0b\x02\x80vllm:x 1\n\x03"),
        ("zstd", b"(\xb5/\xfd"),
        ("compress", b"\x1f\x9d"),
        ("gzip, gzip, gzip, gzip", b"\x1f\x8b"),
        ("gzip", b"\x1f\x8b\x08\x00 this is not gzip at all"),
        ("deflate", b"\xff\xfe this is not deflate either"),
    ],
    ids=["br", "zstd", "compress", "four-layers", "bad-gzip", "bad-deflate"],
)
def test_encodings_that_cannot_be_undone_are_counted(
    engine: _Engine, header: str, body: bytes
) -> None:
    engine.answer = (200, {"Content-Encoding": header}, body)
    sidecar = Sidecar([EngineCollector(EngineScraper(engine.url, timeout_s=2), {})])
    text = asyncio.run(get(sidecar, "/metrics")).text
    assert value(text, "inferwatch_engine_up") == 0
    assert value(text, "inferwatch_engine_scrape_errors_total", reason="encoding") == 1


def cardinality_page(series: int) -> bytes:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{model_name="m{i}",engine="0"}} 1' for i in range(series)]
    return ("\n".join(lines) + "\n").encode()


#: bad scrapes measured at most: a loop held by the scrape is held in every one of them, while
#: a pause of the whole process (a busy machine) seldom lands in each
ATTEMPTS = 3


@pytest.mark.parametrize("page", ["gzip-bomb", "cardinality"])
def test_healthz_keeps_answering_while_a_bad_scrape_runs(engine: _Engine, page: str) -> None:
    """The longest /healthz wait during a bad scrape is a small share of that scrape: the
    event loop is never held for the scrape's whole length (a ratio, not a wall time)."""
    cap = 64 * MiB  # a long enough scrape that incidental pauses of the process do not count
    if page == "gzip-bomb":  # stacked: httpx would inflate the inner layer in one call
        body, header = bomb(("gzip", "gzip"), 4 * cap)
        engine.answer = (200, {"Content-Encoding": header}, body)
    else:
        engine.answer = (200, {}, cardinality_page(100_000))
    sidecar = Sidecar([EngineCollector(EngineScraper(engine.url, timeout_s=60, max_bytes=cap), {})])
    measured = []
    with serving(sidecar) as url:
        for _ in range(ATTEMPTS):
            longest, total, answers = longest_healthz_wait(url)
            assert answers >= 3, f"/healthz answered {answers} times during the scrape"
            measured.append(f"{longest:.3f}s of {total:.3f}s")
            if longest < total / 2:
                break
        else:
            pytest.fail(f"/healthz waited over half of every scrape: {', '.join(measured)}")


def longest_healthz_wait(url: str) -> tuple[float, float, int]:
    """One bad scrape of ``url``: the longest /healthz wait during it, its length, the answers."""
    scrape: list[float] = []
    # A new httpx client costs tens of milliseconds of CPU (its SSL context): both are made
    # before the clock starts, so that only the sidecar is measured.
    scraping = httpx.Client(base_url=url, timeout=60)

    def scrape_metrics() -> None:
        started = time.perf_counter()
        scraping.get("/metrics")
        scrape.append(time.perf_counter() - started)

    scraper = threading.Thread(target=scrape_metrics)
    with scraping, httpx.Client(base_url=url, timeout=60) as client:
        for each in (client, scraping):  # connected before it starts
            assert each.get("/healthz").status_code == 200
        scraper.start()
        waits = []
        while scraper.is_alive():
            asked = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            waits.append(time.perf_counter() - asked)
        scraper.join()
    return max(waits, default=0.0), scrape[0], len(waits)


@contextlib.contextmanager
def serving(sidecar: Sidecar) -> Iterator[str]:
    """The sidecar's app under uvicorn on a loopback port, as ``inferwatch sidecar`` runs it."""
    config = uvicorn.Config(sidecar.app(), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the sidecar ended before it started"
        return server.started

    wait_for(started, "the sidecar to start", 20, interval=0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


# --------------------------------------------------------------------------------------------
# Bounds on what one page may put into the output
# --------------------------------------------------------------------------------------------


def collector_for(pages: Iterator[bytes] | Callable[[], bytes], **kwargs: Any) -> EngineCollector:
    """A collector whose engine answers each scrape with the next page."""
    next_page = pages if callable(pages) else lambda: next(pages)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/metrics":  # the version endpoint
            return httpx.Response(404)
        return httpx.Response(200, content=next_page(), headers={"Content-Type": "text/plain"})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    scraper = EngineScraper("http://engine:8000/metrics", timeout_s=5, client=client)
    return EngineCollector(scraper, {"pod": "p-0"}, engine="vllm", **kwargs)


def scrape_text(collector: EngineCollector, scrapes: int = 1) -> list[str]:
    sidecar = Sidecar([collector])

    async def run() -> list[str]:
        return [(await get(sidecar, "/metrics")).text for _ in range(scrapes)]

    return asyncio.run(run())


def series_named(text: str, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in samples(text) if n == name]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=120),
    cap=st.integers(1, 50),
)
def test_series_and_label_values_over_the_bounds_are_dropped_and_counted(
    lengths: list[int], cap: int
) -> None:
    limit = 100
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [
        f'vllm:num_requests_running{{model_name="{str(i).rjust(n, "m")}",engine="0"}} 1'
        for i, n in enumerate(lengths)
    ]
    page = ("\n".join(lines) + "\n").encode()
    collector = collector_for(lambda: page, limits=Limits(cap, limit))
    text = scrape_text(collector)[0]
    # Model names are made unique by their index, so each line is its own series.
    long = sum(1 for i, n in enumerate(lengths) if max(n, len(str(i))) > limit)
    over = max(len(lengths) - long - cap, 0)
    running = series_named(text, "inferwatch_engine_requests_running")
    assert len(running) == len(lengths) - long - over
    assert all(len(v) <= limit for labels in running for v in labels.values())
    dropped = "inferwatch_engine_scrape_dropped_series_total"
    assert (value(text, dropped, reason="label_too_long") or 0) == long
    assert (value(text, dropped, reason="series_limit") or 0) == over
    assert "vllm:" not in text


def test_drops_are_logged_once_not_on_every_scrape(caplog: pytest.LogCaptureFixture) -> None:
    page = cardinality_page(30)
    collector = collector_for(lambda: page, limits=Limits(series_per_family=10))
    with caplog.at_level(logging.WARNING, logger="inferwatch.engine"):
        texts = scrape_text(collector, scrapes=4)
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 1
    counts = [
        value(t, "inferwatch_engine_scrape_dropped_series_total", reason="series_limit")
        for t in texts
    ]
    assert counts == [20, 40, 60, 80]


def test_engine_up_keeps_its_model_when_the_page_names_another() -> None:
    models = iter(["first", "second", "third", "fourth"])

    def page() -> bytes:
        name = next(models)
        return f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="{name}",engine="0"}} 1\n'.encode()  # noqa: E501

    texts = scrape_text(collector_for(page), scrapes=4)
    identities = [series_named(t, "inferwatch_engine_up") for t in texts]
    assert all(ids == identities[0] for ids in identities)
    assert identities[0][0]["model"] == "first"


# --------------------------------------------------------------------------------------------
# Pages valid as text but wrong as data
# --------------------------------------------------------------------------------------------

HISTOGRAM = "vllm:e2e_request_latency_seconds"
COUNTER = "vllm:prompt_tokens_total"


def histogram_lines(buckets: list[tuple[str, float]], count: float, total: float) -> list[str]:
    lines = [f"# TYPE {HISTOGRAM} histogram"]
    labels = 'engine="0",model_name="m"'
    lines += [f'{HISTOGRAM}_bucket{{{labels},le="{le}"}} {n}' for le, n in buckets]
    lines += [f"{HISTOGRAM}_count{{{labels}}} {count}", f"{HISTOGRAM}_sum{{{labels}}} {total}"]
    return lines


def counter_lines(values: list[float]) -> list[str]:
    lines = [f"# TYPE {COUNTER} counter"]
    lines += [f'{COUNTER}{{engine="{rank}",model_name="m"}} {v}' for rank, v in enumerate(values)]
    return lines


@st.composite
def histograms(draw: st.DrawFn) -> tuple[list[tuple[str, float]], float, float]:
    """A sound histogram series: ascending bounds, cumulative counts, +Inf = _count."""
    bounds = sorted(set(draw(st.lists(st.integers(1, 10_000), min_size=1, max_size=8))))
    counts = draw(st.lists(st.integers(0, 50), min_size=len(bounds) + 1, max_size=len(bounds) + 1))
    cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
    les = [str(b / 1000) for b in bounds] + ["+Inf"]
    return list(zip(les, map(float, cumulative), strict=True)), float(cumulative[-1]), 1.5


CORRUPTIONS = ["duplicate", "falling_bucket", "nan_bucket", "negative_count", "count_vs_inf"]


def corrupt(kind: str, histogram: tuple[list[tuple[str, float]], float, float]) -> list[str]:
    buckets, count, total = histogram
    buckets = list(buckets)
    if kind == "duplicate":
        lines = histogram_lines(buckets, count, total)
        return [*lines, lines[1]]
    if kind == "falling_bucket":
        buckets.insert(0, ("0.0001", count + 1))
    elif kind == "nan_bucket":
        buckets[0] = (buckets[0][0], math.nan)
    elif kind == "negative_count":
        count = -1.0
    elif kind == "count_vs_inf":
        count += 1
    return histogram_lines(buckets, count, total)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    histogram=histograms(),
    kind=st.sampled_from(CORRUPTIONS),
    counts=st.lists(st.integers(0, 10**6), min_size=1, max_size=4),
)
def test_a_family_wrong_as_data_is_dropped_alone_and_counted(
    histogram: tuple[list[tuple[str, float]], float, float], kind: str, counts: list[int]
) -> None:
    lines = corrupt(kind, histogram) + counter_lines([float(c) for c in counts])
    page = ("\n".join(lines) + "\n").encode()
    text = scrape_text(collector_for(lambda: page))[0]
    assert value(text, "inferwatch_engine_up") == 1
    assert not series_named(text, "inferwatch_engine_request_duration_seconds_count")
    dropped = value(text, "inferwatch_engine_scrape_dropped_series_total", reason="malformed")
    assert dropped == 1
    # The sound family next to it is read as usual.
    assert value(text, "inferwatch_engine_prompt_tokens_total") == sum(counts)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histogram=histograms(), counts=st.lists(st.integers(0, 10**6), min_size=1, max_size=4))
def test_sound_families_pass(
    histogram: tuple[list[tuple[str, float]], float, float], counts: list[int]
) -> None:
    lines = histogram_lines(*histogram) + counter_lines([float(c) for c in counts])
    page = ("\n".join(lines) + "\n").encode()
    text = scrape_text(collector_for(lambda: page))[0]
    count = value(text, "inferwatch_engine_request_duration_seconds_count")
    assert count == histogram[1]
    assert value(text, "inferwatch_engine_scrape_dropped_series_total", reason="malformed") is None


@pytest.mark.parametrize("bad", [math.nan, -3.0, math.inf])
def test_a_counter_that_no_count_can_be_is_dropped(bad: float) -> None:
    page = ("\n".join(counter_lines([10.0, bad])) + "\n").encode()
    text = scrape_text(collector_for(lambda: page))[0]
    assert value(text, "inferwatch_engine_prompt_tokens_total") is None
    assert value(text, "inferwatch_engine_scrape_dropped_series_total", reason="malformed") == 2


# --------------------------------------------------------------------------------------------
# Counters stay monotonic when one data-parallel rank restarts
# --------------------------------------------------------------------------------------------

#: per scrape, per rank: ("add", n) counts on, ("restart", n) starts again at n, ("gone", 0)
#: leaves the rank off the page for that scrape
Step = tuple[str, int]


@st.composite
def rank_histories(draw: st.DrawFn) -> list[list[Step]]:
    ranks = draw(st.integers(1, 4))
    scrapes = draw(st.integers(2, 12))
    step = st.tuples(st.sampled_from(["add", "add", "restart", "gone"]), st.integers(0, 1000))
    return [draw(st.lists(step, min_size=ranks, max_size=ranks)) for _ in range(scrapes)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=rank_histories())
def test_summed_counters_rise_by_exactly_the_ranks_increases(history: list[list[Step]]) -> None:
    ranks = len(history[0])
    current: list[float | None] = [None] * ranks
    pages: list[bytes] = []
    increases: list[float] = []  # what rate() adds up over the ranks' own series
    last_seen: list[float | None] = [None] * ranks
    for steps in history:
        increase = 0.0
        for rank, (kind, n) in enumerate(steps):
            if kind == "gone":
                current[rank] = None
                continue
            before = last_seen[rank]
            now = float(n) if kind == "restart" or before is None else before + n
            current[rank] = last_seen[rank] = now
            # a rank seen for the first time brings its whole count into the sum
            increase += now - before if before is not None and now >= before else now
        present = [(rank, v) for rank, v in enumerate(current) if v is not None]
        lines = [f"# TYPE {COUNTER} counter"]
        lines += [f'{COUNTER}{{engine="{rank}",model_name="m"}} {v}' for rank, v in present]
        pages.append(("\n".join(lines) + "\n").encode())
        increases.append(increase)
    texts = scrape_text(collector_for(iter(pages)), scrapes=len(pages))
    totals = [value(t, "inferwatch_engine_prompt_tokens_total") for t in texts]
    previous = None
    for total, increase in zip(totals, increases, strict=True):
        if previous is not None and total is not None:
            assert total >= previous
            assert total - previous == increase
        if total is not None:
            previous = total


def test_one_rank_restarting_does_not_drop_the_sum() -> None:
    pages = iter(
        ("\n".join(counter_lines(values)) + "\n").encode()
        for values in ([100.0, 200.0], [110.0, 210.0], [120.0, 5.0], [130.0, 15.0])
    )
    texts = scrape_text(collector_for(pages), scrapes=4)
    totals = [value(t, "inferwatch_engine_prompt_tokens_total") for t in texts]
    assert totals == [300.0, 320.0, 335.0, 355.0]


# --------------------------------------------------------------------------------------------
# One failed upstream fetch shared by N concurrent scrapers counts once
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "reason"), [(500, "http_status"), (200, "empty")])
def test_one_failed_fetch_shared_by_many_scrapers_counts_once(
    engine: _Engine, status: int, reason: str
) -> None:
    engine.answer = (status, {}, b"")
    engine.delay = 0.3
    sidecar = Sidecar([EngineCollector(EngineScraper(engine.url, timeout_s=5), {})])

    async def run() -> list[str]:
        transport = httpx.ASGITransport(app=sidecar.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
            responses = await asyncio.gather(*(client.get("/metrics") for _ in range(6)))
            responses.append(await client.get("/metrics"))  # after: the counter as it stands
        return [r.text for r in responses]

    texts = asyncio.run(run())
    assert engine.hits == 2  # the six shared one request, the last made its own
    assert value(texts[-1], "inferwatch_engine_scrape_errors_total", reason=reason) == 2


def test_scrapers_giving_up_on_one_hung_fetch_count_one_timeout(engine: _Engine) -> None:
    engine.answer = (200, {}, cardinality_page(1))
    engine.delay = 1.5
    collector = EngineCollector(EngineScraper(engine.url, timeout_s=1.0), {})

    async def run() -> None:
        waiters = [collector.collect(deadline=0.2) for _ in range(4)]
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, ScrapeFailure) and r.reason == "timeout" for r in results)
        with contextlib.suppress(ScrapeFailure):  # the shared fetch's own timeout
            await collector.collect()
        await collector.aclose()

    asyncio.run(run())
    assert dict(collector.errors) == {"timeout": 1}


def test_a_scrape_that_overruns_a_late_waking_loop_still_counts_its_timeout() -> None:
    """A busy process wakes the event loop late, past the engine's deadline: the scrape is
    still recorded as a timeout with engine_up 0, not dropped by a second timer."""

    def page() -> bytes:
        time.sleep(1.5)  # holds the event loop itself, as a starved process would
        return cardinality_page(1)

    sidecar = Sidecar([collector_for(page)])

    async def run() -> str:
        transport = httpx.ASGITransport(app=sidecar.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
            headers = {"X-Prometheus-Scrape-Timeout-Seconds": "1.5"}  # a 1 s engine deadline
            return (await client.get("/metrics", headers=headers)).text

    text = asyncio.run(run())
    assert value(text, "inferwatch_engine_up") == 0
    assert value(text, "inferwatch_engine_scrape_errors_total", reason="timeout") == 1
