"""vLLM 0.32's families the catalogue maps since it was run for real: on a live page, each of
them has a canonical series, and the requests vLLM refused are counted."""

from __future__ import annotations

import httpx
import pytest

from inferwatch import catalog, identity
from inferwatch.exporters.engine import adapters
from inferwatch.exporters.engine.adapters import mapping
from inferwatch.serving import textformat
from support.realengine import MODEL, Engines

pytestmark = pytest.mark.realengine

#: the vLLM 0.32 families no catalogue entry read before (issue 22, finding 8)
FAMILIES = (
    "vllm:admission_rejections", "vllm:engine_sleep_state",
    "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds", "vllm:iteration_tokens_total",
    "vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu",
    "vllm:estimated_write_bytes_per_gpu", "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits", "vllm:mm_cache_queries", "vllm:mm_cache_hits",
    "vllm:num_requests_waiting_by_reason", "vllm:request_params_max_tokens",
    "vllm:request_prefill_kv_computed_tokens", "http_requests_total",
)  # fmt: skip


def traffic(client: httpx.Client) -> list[int]:
    """Served and refused requests (the traffic behind tests/golden/vllm-0.32.0-cpu-tiny.prom)."""
    bodies = (
        ("/v1/completions", {"prompt": "the sidecar reads", "max_tokens": 4}),
        ("/v1/completions", {"prompt": "a replica with a dead engine", "max_tokens": 8,
                             "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}],
                                  "max_tokens": 4}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 5000}),
        ("/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 4}),
        ("/v1/completions", {"prompt": "word " * 1500, "max_tokens": 4}),
    )  # fmt: skip
    return [client.post(path, json={"model": MODEL, **body}).status_code for path, body in bodies]


def test_every_new_vllm_family_has_a_canonical_series(engines: Engines) -> None:
    engine = engines.vllm()
    with httpx.Client(base_url=engine.url, timeout=120) as client:
        before = _refused(client.get("/metrics").text)
        assert traffic(client) == [200, 200, 200, 400, 404, 400]
        page = client.get("/metrics").text
    exposition = textformat.parse(page)
    labels = dict.fromkeys(identity.KEYS, "") | {"engine": "vllm"}
    mapped = {f.name: f for f in adapters.normalize(exposition, "vllm", labels)}
    by_source = {
        mapping.fold(alias.metric): spec
        for spec in catalog.load().by_collector("engine")
        for alias in spec.sources.get("vllm", ())
    }
    for family in FAMILIES:
        spec = by_source.get(mapping.fold(family))
        assert spec is not None, f"{family}: no catalogue entry reads it"
        assert spec.name.removesuffix("_total") in mapped, f"{family}: no series on the page"
        assert {s.labels["model"] for s in mapped[spec.name.removesuffix("_total")].samples} == {
            MODEL
        }
    assert _refused(page) - before == 3  # the three requests vLLM answered with a 4xx


def _refused(page: str) -> float:
    """4xx answers on a mapped page, summed over routes."""
    families = adapters.normalize(textformat.parse(page), "vllm", {})
    return sum(
        s.value
        for f in families
        if f.name == "inferwatch_engine_http_requests"
        for s in f.samples
        if s.labels["status"] == "4xx"
    )
