"""vLLM 0.32's page as the real engine writes it (tests/golden/vllm-0.32.0-cpu-tiny.prom, made
by this project's own run of vLLM's CPU build): every family on it is mapped, or left out
here with the reason, and its mapped form is a golden."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest

from inferwatch import catalog
from inferwatch.exporters.engine import adapters as engines
from inferwatch.exporters.engine.adapters import mapping
from inferwatch.serving import textformat

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).resolve().parent / "golden"
PAGE = GOLDEN / "vllm-0.32.0-cpu-tiny.prom"
MAPPED = GOLDEN / "vllm-0.32.0-cpu-tiny.mapped.prom"
IDENTITY = {"model": "unknown", "model_version": "unknown", "engine": "vllm",
            "engine_version": "0.32.0"}  # fmt: skip

#: vLLM families on the page that no catalogue entry reads, and why
LEFT_OUT = {
    # splits of counters that are mapped (prompt tokens, cached prompt tokens)
    "vllm_prompt_tokens_by_source": "split of vllm:prompt_tokens",
    "vllm_prompt_tokens_cached_by_source": "split of vllm:prompt_tokens_cached",
    # request parameters and per-request counts the mapped signals already give
    "vllm_request_max_num_generation_tokens": "equal to generated tokens per request for n=1",
    "vllm_request_params_n": "n>1 shows as prompt tokens counted once per choice",
    "vllm_request_num_preemptions": "vllm:num_preemptions counts the same preemptions",
    # the HTTP server's size and latency histograms: the engine's own latency is mapped
    "http_request_size_bytes": "client payload sizes",
    "http_response_size_bytes": "client payload sizes",
    "http_request_duration_seconds": "vllm:e2e_request_latency_seconds times the engine",
    "http_request_duration_highr_seconds": "the same, finer buckets",
}


class _Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _mapped() -> list[Metric]:
    exposition = textformat.parse(PAGE.read_bytes())
    assert engines.detect(exposition) == "vllm"
    return engines.normalize(exposition, "vllm", IDENTITY)


def read_families() -> set[str]:
    """Folded vLLM family names some catalogue entry or derivation of vLLM reads."""
    read = {
        mapping.fold(alias.metric)
        for spec in catalog.load().by_collector("engine")
        for alias in spec.sources.get("vllm", ())
    }
    return read | {mapping.fold("vllm:cache_config_info")}


def test_every_vllm_family_on_the_page_is_mapped_or_left_out_with_a_reason() -> None:
    exposition = textformat.parse(PAGE.read_bytes())
    families = {
        mapping.fold(name)
        for name, family in exposition.families.items()
        if name.startswith(("vllm:", "http_")) and not name.endswith("_created")
    }
    unread = families - read_families()
    assert unread == set(LEFT_OUT)


def test_mapped_page_golden(golden: Callable[[Path, str], None]) -> None:
    """The mapped page equals its golden (the fixture compares; promtool checks it in
    test_engines.py), and every family on it is a catalogue name."""
    text = generate_latest(_Families(_mapped())).decode()  # type: ignore[arg-type]
    golden(MAPPED, text)
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert names and all(name.startswith("inferwatch_") for name in names)


def _values(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(
            sorted(
                (k, v) for k, v in s.labels.items() if k in ("handler", "status", "state", "reason")
            )
        ): s.value
        for family in _mapped()
        for s in family.samples
        if s.name == name
    }


def test_http_answers_by_status_count_the_requests_vllm_refused() -> None:
    """Three requests vLLM refused (max_tokens over the context, an unknown model, a prompt
    over the context) are nowhere in its request counters, only in its HTTP server's."""
    answers = _values("inferwatch_engine_http_requests_total")
    refused = sum(v for labels, v in answers.items() if ("status", "4xx") in labels)
    assert refused == 3
    assert answers[(("handler", "/v1/chat/completions"), ("status", "2xx"))] == 1


def test_sleep_state_one_series_per_state() -> None:
    assert _values("inferwatch_engine_sleep_state") == {
        (("state", "awake"),): 1.0,
        (("state", "discard_all"),): 0.0,
        (("state", "weights_offloaded"),): 0.0,
    }


def test_model_identity_comes_from_model_name_on_every_series() -> None:
    models = {s.labels["model"] for family in _mapped() for s in family.samples}
    assert models == {"tiny"}
