"""The sidecar's HTTP behaviour against real and broken engine pages."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch.exporters import gpu
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.logs import JsonFormatter
from inferwatch.serving.page_fetch import EngineScraper
from inferwatch.serving.readiness import Condition
from support.exposition import samples, value
from support.shared import shared_path

pytestmark = pytest.mark.unit

FIXTURES = shared_path("fixtures")
REPO = Path(__file__).resolve().parent.parent
VLLM_PAGE = "fixture/vllm-generated-0.33.0-1engine/metrics"


def make_sidecar(
    url: str,
    *,
    timeout: float = 1.0,
    max_bytes: int = 1 << 20,
    sources: Sequence[object] = (),
    **kwargs: Any,
) -> Sidecar:
    scraper = EngineScraper(url, timeout_s=timeout, max_bytes=max_bytes)
    return Sidecar([EngineCollector(scraper, {"model": "m", "pod": "p-0"}), *sources], **kwargs)


async def _get(sidecar: Sidecar, path: str, **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=sidecar.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
        return await client.get(path, headers=headers)


def get(sidecar: Sidecar, path: str, **headers: str) -> httpx.Response:
    return asyncio.run(_get(sidecar, path, **headers))


def test_healthy_vllm_page_becomes_canonical_metrics(page_server: Any) -> None:
    sidecar = make_sidecar(f"{page_server.url}/{VLLM_PAGE}")
    response = get(sidecar, "/metrics")
    assert response.status_code == 200
    text = response.text
    assert value(text, "inferwatch_engine_up", engine="vllm", pod="p-0") == 1
    assert value(text, "inferwatch_collector_success", collector="engine") == 1
    assert value(text, "inferwatch_engine_requests_running", engine="vllm") is not None
    page_size = len(fixture_page(VLLM_PAGE))
    assert value(text, "inferwatch_engine_scrape_size_bytes") == page_size
    assert "vllm:" not in text, "engine-native names must not leak into the canonical page"
    assert get(sidecar, "/readyz").status_code == 200


def fixture_page(page: str) -> bytes:
    name = page.split("/")[1]
    return (FIXTURES / "engines" / f"{name}.prom").read_bytes()


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("hang/metrics", "timeout"),
        ("slow/3/metrics", "timeout"),
        ("html/metrics", "not_metrics"),
        ("html-as-text/metrics", "not_metrics"),
        ("error/metrics", "http_status"),
        ("empty/metrics", "empty"),
        ("huge/metrics", "too_large"),
    ],
)
def test_broken_engine_pages_are_counted_not_fatal(
    page_server: Any, path: str, reason: str
) -> None:
    # a short deadline only where the timeout is the point: a busy machine may take longer
    # than that to fetch and refuse a 2 MB page
    sidecar = make_sidecar(f"{page_server.url}/{path}", timeout=0.5 if reason == "timeout" else 10)
    response = get(sidecar, "/metrics")
    assert response.status_code == 200
    assert value(response.text, "inferwatch_engine_up") == 0
    assert value(response.text, "inferwatch_engine_scrape_errors_total", reason=reason) == 1
    assert value(response.text, "inferwatch_collector_success", collector="engine") == 0
    assert value(response.text, "inferwatch_exporter_build_info") == 1
    ready = get(sidecar, "/readyz")
    assert ready.status_code == 503
    assert json.loads(ready.text)["conditions"][0]["name"] == "engine"


def test_engine_down_is_a_connect_error(unused_port: int) -> None:
    sidecar = make_sidecar(f"http://127.0.0.1:{unused_port}/metrics")
    text = get(sidecar, "/metrics").text
    assert value(text, "inferwatch_engine_up") == 0
    assert value(text, "inferwatch_engine_scrape_errors_total", reason="connect") == 1


def test_unknown_engine_is_counted(page_server: Any) -> None:
    page_server.page = b"# TYPE node_load1 gauge\nnode_load1 0.5\n"
    text = get(make_sidecar(f"{page_server.url}/page/metrics"), "/metrics").text
    assert value(text, "inferwatch_engine_scrape_errors_total", reason="unknown_engine") == 1


def test_malformed_lines_are_counted_and_the_rest_is_used(page_server: Any) -> None:
    page = fixture_page(VLLM_PAGE)
    page_server.page = page.replace(
        b"# HELP vllm:num_requests_waiting ",
        b'vllm:broken{engine="0" 1 2 3\n# HELP vllm:num_requests_waiting ',
    )
    text = get(make_sidecar(f"{page_server.url}/page/metrics"), "/metrics").text
    assert value(text, "inferwatch_engine_up") == 1
    assert value(text, "inferwatch_engine_scrape_parse_errors_total") == 1
    assert value(text, "inferwatch_engine_requests_waiting") is not None


def test_prometheus_scrape_timeout_header_bounds_the_engine_scrape(page_server: Any) -> None:
    sidecar = make_sidecar(f"{page_server.url}/hang/metrics", timeout=30)
    response = get(sidecar, "/metrics", **{"X-Prometheus-Scrape-Timeout-Seconds": "1"})
    assert value(response.text, "inferwatch_engine_scrape_errors_total", reason="timeout") == 1


def test_concurrent_scrapes_share_one_upstream_request(page_server: Any) -> None:
    page_server.page = fixture_page(VLLM_PAGE)
    sidecar = make_sidecar(f"{page_server.url}/slow/0.3/metrics")

    async def five_at_once() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=sidecar.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
            return await asyncio.gather(*(client.get("/metrics") for _ in range(5)))

    responses = asyncio.run(five_at_once())
    assert all(value(r.text, "inferwatch_engine_up") == 1 for r in responses)
    assert page_server.hits["/slow/0.3/metrics"] == 1


def test_a_scrape_cancelled_as_its_page_lands_is_cancelled(page_server: Any) -> None:
    """A caller cancelled in the same turn of the loop that its shared scrape finishes
    stops. 3.11's ``asyncio.wait_for`` handed it the page instead, so a loop around it
    (the start-up tracker's) never stopped and the sidecar's shutdown hung."""
    collector = EngineCollector(EngineScraper(f"{page_server.url}/{VLLM_PAGE}"), {})

    async def cancelled_as_it_lands() -> asyncio.Task[object]:
        caller = asyncio.create_task(collector.collect())
        while collector._in_flight is None:
            await asyncio.sleep(0)
        await collector._in_flight  # the page is in; the caller has not woken yet
        caller.cancel()
        await asyncio.gather(caller, return_exceptions=True)
        return caller

    assert asyncio.run(cancelled_as_it_lands()).cancelled()


def test_gzip_from_the_engine_and_to_the_scraper(page_server: Any) -> None:
    page_server.page = fixture_page(VLLM_PAGE)
    sidecar = make_sidecar(f"{page_server.url}/gzip/metrics")
    transport = httpx.ASGITransport(app=sidecar.app())

    async def raw() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
            request = client.build_request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            return await client.send(request, stream=True)

    response = asyncio.run(raw())
    assert response.headers["content-encoding"] == "gzip"
    body = gzip.decompress(asyncio.run(_read(response)))
    assert value(body.decode(), "inferwatch_engine_up") == 1


async def _read(response: httpx.Response) -> bytes:
    return b"".join([chunk async for chunk in response.aiter_raw()])


def test_openmetrics_is_served_when_asked(page_server: Any) -> None:
    sidecar = make_sidecar(f"{page_server.url}/{VLLM_PAGE}")
    response = get(sidecar, "/metrics", Accept="application/openmetrics-text; version=1.0.0")
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")


class _FailingCollector:
    name = "flaky"

    async def collect(self, deadline: float | None = None) -> list[Any]:
        raise RuntimeError("device vanished")


def test_the_sidecar_logs_a_failure_once_unless_the_source_logged_it(
    unused_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    sidecar = make_sidecar(f"http://127.0.0.1:{unused_port}/metrics", sources=[_FailingCollector()])
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            text = get(sidecar, "/metrics").text
    assert value(text, "inferwatch_collector_success", collector="engine") == 0
    failed = [
        json.loads(JsonFormatter().format(r))
        for r in caplog.records
        if r.getMessage() == "collector failed"
    ]
    # the engine logged its own failure with the reason; the sidecar adds nothing for it
    assert [(f["collector"], f["error"]) for f in failed] == [
        ("flaky", "RuntimeError: device vanished")
    ]
    engine = [r for r in caplog.records if r.getMessage() == "engine scrape failed"]
    assert len(engine) == 1


class _Quality:
    def __init__(self) -> None:
        self.ok = True

    def readiness(self) -> list[Condition]:
        return [Condition("quality", self.ok, "" if self.ok else "pass rate 0.40 < 0.80")]


def test_a_failing_collector_costs_only_its_own_metrics(page_server: Any) -> None:
    sidecar = make_sidecar(f"{page_server.url}/{VLLM_PAGE}", sources=[_FailingCollector()])
    text = get(sidecar, "/metrics").text
    assert value(text, "inferwatch_collector_success", collector="flaky") == 0
    assert value(text, "inferwatch_collector_success", collector="engine") == 1
    assert value(text, "inferwatch_engine_requests_running") is not None


def test_any_failing_readiness_condition_fails_readyz(page_server: Any) -> None:
    quality = _Quality()
    sidecar = make_sidecar(f"{page_server.url}/{VLLM_PAGE}", sources=[quality])
    assert get(sidecar, "/readyz").status_code == 200
    quality.ok = False
    response = get(sidecar, "/readyz")
    assert response.status_code == 503
    conditions = {c["name"]: c for c in json.loads(response.text)["conditions"]}
    assert conditions["engine"]["ok"] is True
    assert conditions["quality"] == {
        "name": "quality",
        "ok": False,
        "reason": "pass rate 0.40 < 0.80",
    }


def test_a_sleeping_engine_is_not_ready(page_server: Any) -> None:
    """vLLM in sleep mode answers its health check and /metrics, but serves nothing: the page
    of a real vLLM 0.32, put to sleep at level 1."""
    page = (REPO / "tests" / "golden" / "vllm-0.32.0-cpu-tiny.prom").read_bytes()
    awake = b'sleep_state="awake"} 1.0'
    asleep = page.replace(awake, b'sleep_state="awake"} 0.0').replace(
        b'sleep_state="weights_offloaded"} 0.0', b'sleep_state="weights_offloaded"} 1.0'
    )
    assert awake in page and asleep != page
    page_server.page = asleep
    sidecar = make_sidecar(f"{page_server.url}/page/metrics")
    response = get(sidecar, "/readyz")
    assert response.status_code == 503
    conditions = {c["name"]: c for c in json.loads(response.text)["conditions"]}
    assert conditions["engine"] == {
        "name": "engine",
        "ok": False,
        "reason": "vllm is asleep (weights_offloaded) and serves no request",
    }
    assert value(get(sidecar, "/metrics").text, "inferwatch_engine_up", model="m") == 1
    page_server.page = page  # woken: the next scrape makes it ready again
    get(sidecar, "/metrics")
    assert get(sidecar, "/readyz").status_code == 200


def test_healthz_answers_while_the_engine_is_down(unused_port: int) -> None:
    sidecar = make_sidecar(f"http://127.0.0.1:{unused_port}/metrics")
    assert get(sidecar, "/healthz").status_code == 200


def test_gpu_telemetry_joins_metrics_and_readiness(page_server: Any) -> None:
    backend = gpu.open_backend(f"replay={FIXTURES / 'gpu' / 'nvml-h200'}")
    try:
        sidecar = make_sidecar(f"{page_server.url}/{VLLM_PAGE}", sources=[backend])
        text = get(sidecar, "/metrics").text
        assert value(text, "inferwatch_collector_success", collector=backend.name) == 1
        assert value(text, "inferwatch_gpu_power_watts") is not None
        conditions = json.loads(get(sidecar, "/readyz").text)["conditions"]
        assert {c["name"] for c in conditions} == {"engine", "gpu", "isolated"}
    finally:
        backend.close()


def test_a_fixed_engine_that_the_page_does_not_match_is_counted(page_server: Any) -> None:
    scraper = EngineScraper(f"{page_server.url}/{VLLM_PAGE}", timeout_s=1.0)
    sidecar = Sidecar([EngineCollector(scraper, {}, engine="tgi")])
    text = get(sidecar, "/metrics").text
    assert value(text, "inferwatch_engine_up", engine="tgi") == 0
    assert value(text, "inferwatch_engine_scrape_errors_total", reason="unknown_engine") == 1


def test_a_new_engine_behind_the_url_is_detected_again(page_server: Any) -> None:
    sidecar = make_sidecar(f"{page_server.url}/page/metrics")
    page_server.page = fixture_page(VLLM_PAGE)
    assert value(get(sidecar, "/metrics").text, "inferwatch_engine_up", engine="vllm") == 1
    page_server.page = fixture_page("fixture/tgi-datadog-payload/metrics")
    assert value(get(sidecar, "/metrics").text, "inferwatch_engine_up", engine="tgi") == 1


def test_readiness_conditions_are_served_as_one_series_each(page_server: Any) -> None:
    quality = _Quality()
    sidecar = make_sidecar(f"{page_server.url}/{VLLM_PAGE}", sources=[quality])
    text = get(sidecar, "/metrics").text
    assert value(text, "inferwatch_replica_ready", condition="engine", model="m", pod="p-0") == 1
    assert value(text, "inferwatch_replica_ready", condition="quality") == 1
    quality.ok = False
    text = get(sidecar, "/metrics").text
    assert value(text, "inferwatch_replica_ready", condition="quality") == 0
    assert value(text, "inferwatch_replica_ready", condition="engine") == 1
    # the reason text stays in /readyz: the series' labels do not change with it
    names = {labels for (name, labels) in samples(text) if name == "inferwatch_replica_ready"}
    assert all(dict(labels).keys() >= {"model", "pod", "condition"} for labels in names)
    assert not any("reason" in dict(labels) for labels in names)
