"""End to end: one request through the proxy is one trace, and a real Prometheus (exemplar
storage on) returns that trace's id as the exemplar of the TTFT bucket the request fell in.

The proxy traces to a local OTLP/HTTP receiver (decoded with opentelemetry-proto); Prometheus
scrapes the proxy's metrics listener in OpenMetrics, as it negotiates by default.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch import tracing
from inferwatch.serving.histogram import TTFT_BUCKETS_LONG
from support.otlp import receiver
from support.prometheus_process import start_prometheus
from support.proxy_stack import CHAT, Stack, auth
from support.wait import wait_for

pytestmark = pytest.mark.e2e

TTFT = "inferwatch_tenancy_time_to_first_token_seconds_bucket"


@pytest.fixture
def prometheus(prometheus_bin: str, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Start Prometheus with exemplar storage scraping one target; yields a starter."""
    started: list[Any] = []

    def start(target: str) -> str:
        scrape = f"  - job_name: proxy\n    static_configs: [{{targets: ['{target}']}}]\n"
        process, url = start_prometheus(
            prometheus_bin, scrape, tmp_path, "--enable-feature=exemplar-storage"
        )
        started.append(process)
        return str(url)

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def bucket_of(value: float) -> str:
    """The ``le`` of the bucket a TTFT of ``value`` seconds is counted in first."""
    return next((repr(bound) for bound in TTFT_BUCKETS_LONG if value <= bound), "+Inf")


def test_the_trace_of_a_request_is_the_exemplar_prometheus_stores_on_its_ttft_bucket(
    stack: Callable[..., Stack], prometheus: Callable[[str], str]
) -> None:
    with receiver() as otlp:
        provider = tracing.provider("inferwatch-proxy", tracing.TraceOptions(otlp.url, 1.0))
        assert provider is not None
        try:
            proxy = stack(tracer_provider=provider)
            url = prometheus(proxy.server.metrics_url.removeprefix("http://"))
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "stream": True,
            }
            with proxy.client.stream("POST", CHAT, json=body, headers=auth("acme")) as reply:
                assert reply.status_code == 200
                reply.read()
            span = otlp.wait_for_span(
                lambda span: span.attributes.get("inferwatch.tenant") == "acme",
                "the request's span",
                provider.force_flush,
            )
            start = time.time() - 600

            def stored() -> list[dict[str, Any]]:
                response = httpx.get(
                    f"{url}/api/v1/query_exemplars",
                    params={"query": TTFT, "start": start, "end": time.time() + 60},
                )
                response.raise_for_status()
                found: list[dict[str, Any]] = response.json()["data"]
                return found

            (series,) = wait_for(stored, "Prometheus to store the TTFT exemplar")
        finally:
            provider.shutdown()
    (exemplar,) = series["exemplars"]
    assert exemplar["labels"] == {"trace_id": span.trace_id}
    assert series["seriesLabels"]["tenant"] == "acme"
    assert series["seriesLabels"]["le"] == bucket_of(float(exemplar["value"]))
