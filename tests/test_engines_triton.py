"""Triton's latency summaries (``--metrics-config summary_latencies=true``) feed the same
catalogue histograms as its default latency counters, and its labels become ours, also on
the families of vLLM served as a Triton backend."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.core import Metric

from inferwatch.cli import main
from inferwatch.exporters.engine import adapters as engines
from inferwatch.exporters.engine.checks import PageChecks
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.logs import JsonFormatter
from inferwatch.serving import textformat
from inferwatch.serving.page_fetch import EngineScraper

pytestmark = pytest.mark.unit

LABELS = 'model="tensorrt_llm",version="1"'


def summary(name: str, help_text: str, count: int, total: int) -> str:
    """A summary as Triton writes it (the layout of its metrics documentation's example)."""
    quantiles = "".join(
        f'{name}{{{LABELS},quantile="{q}"}} {v}\n'
        for q, v in (("0.5", 55), ("0.9", 97), ("0.95", 98), ("0.99", 101), ("0.999", 101))
    )
    return (
        f"# HELP {name} {help_text}\n# TYPE {name} summary\n"
        f"{name}_count{{{LABELS}}} {count}\n{name}_sum{{{LABELS}}} {total}\n{quantiles}"
    )


SUCCESS = f"""\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{{LABELS}}} 161
"""
COUNTERS = f"""\
# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{{{LABELS}}} 48300300
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{{LABELS}}} 11110
"""
SUMMARIES = summary(
    "nv_inference_request_summary_us",
    "Summary of inference request duration in microseconds (includes cached requests)",
    163,
    48400000,
) + summary(
    "nv_inference_queue_summary_us",
    "Summary of inference queuing duration in microseconds (includes cached requests)",
    163,
    11200,
)


def normalized(page: str) -> list[Metric]:
    exposition = textformat.parse(page.encode())
    assert engines.detect(exposition) == "triton"
    return engines.normalize(exposition, "triton", {})


def histogram(families: list[Metric], name: str) -> dict[str, object]:
    (family,) = [f for f in families if f.name == name]
    found: dict[str, object] = {}
    for sample in family.samples:
        suffix = sample.name.removeprefix(name)
        if suffix == "_bucket":
            found.setdefault("buckets", []).append((sample.labels["le"], sample.value))  # type: ignore[union-attr]
        else:
            found[suffix] = sample.value
        found["labels"] = {k: v for k, v in sample.labels.items() if k != "le"}
    return found


def test_summaries_alone_give_the_latency_histograms() -> None:
    """counter_latencies=false summary_latencies=true: only the summaries carry latency."""
    families = normalized(SUCCESS + SUMMARIES)
    e2e = histogram(families, "inferwatch_engine_request_duration_seconds")
    assert e2e["buckets"] == [("+Inf", 163)]
    assert e2e["_count"] == 163 and math.isclose(e2e["_sum"], 48.4)  # type: ignore[arg-type]
    assert e2e["labels"] == {"model": "tensorrt_llm", "model_version": "1", **blank()}
    queue = histogram(families, "inferwatch_engine_request_queue_duration_seconds")
    assert queue["_count"] == 163 and math.isclose(queue["_sum"], 0.0112)  # type: ignore[arg-type]
    names = {s.name for f in families for s in f.samples}
    assert not any("quantile" in s.labels for f in families for s in f.samples)
    assert "inferwatch_engine_request_duration_seconds_bucket" in names


def test_summaries_win_over_the_counters_when_both_are_on() -> None:
    families = normalized(SUCCESS + COUNTERS + SUMMARIES)
    e2e = histogram(families, "inferwatch_engine_request_duration_seconds")
    assert e2e["_count"] == 163  # the summary's own count, not the success counter's 161


def test_counters_alone_still_work() -> None:
    families = normalized(SUCCESS + COUNTERS)
    e2e = histogram(families, "inferwatch_engine_request_duration_seconds")
    assert e2e["_count"] == 161 and math.isclose(e2e["_sum"], 48.3003)  # type: ignore[arg-type]


def blank() -> dict[str, str]:
    """The engine identity labels a bare normalize leaves empty (the sidecar fills them)."""
    return {
        "engine": "",
        "engine_version": "",
        "prompt_version": "",
        "pod": "",
        "namespace": "",
        "node": "",
    }


#: vLLM as a Triton backend: Triton's own families next to vLLM's, all labelled Triton's way
#: (the label shape of the vLLM backend's documented metrics page; values made up)
HOSTED_VLLM = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="vllm_model",version="1"} 3
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model="vllm_model",version="1"} 10
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model="vllm_model",version="1"} 16
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model="vllm_model",version="1"} 0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_count{model="vllm_model",version="1"} 1
vllm:time_to_first_token_seconds_sum{model="vllm_model",version="1"} 0.0323
vllm:time_to_first_token_seconds_bucket{model="vllm_model",version="1",le="0.001"} 0
vllm:time_to_first_token_seconds_bucket{model="vllm_model",version="1",le="+Inf"} 1
"""


def test_vllm_hosted_in_triton_takes_its_identity_from_tritons_labels() -> None:
    exposition = textformat.parse(HOSTED_VLLM.encode())
    assert engines.detect(exposition) == "vllm"
    identity = {"model": "unknown", "model_version": "unknown"}
    families = engines.normalize(exposition, "vllm", identity)
    labelled = {
        (f.name, s.labels["model"], s.labels["model_version"]) for f in families for s in f.samples
    }
    assert {name for name, _, _ in labelled} >= {
        "inferwatch_engine_prompt_tokens",
        "inferwatch_engine_generation_tokens",
        "inferwatch_engine_time_to_first_token_seconds",
    }
    assert {(model, version) for _, model, version in labelled} == {("vllm_model", "1")}
    assert engines.hosted_in(exposition, "vllm") == "triton"


def test_hosted_page_read_with_the_engines_filter_keeps_its_host() -> None:
    """Once the engine is known the sidecar parses only what the adapter reads, which leaves
    Triton's own families out: the next scrape must still be read Triton's way."""
    exposition = textformat.parse(HOSTED_VLLM.encode(), wanted=engines.wanted("vllm"))
    assert not any(name.startswith("nv_") for name in exposition.families)
    assert engines.hosted_in(exposition, "vllm") == "triton"


#: the vLLM backend's documented page: ``vllm:`` families in Triton's labels and no ``nv_*``
#: family (Triton's own metrics scraped elsewhere, or turned off); no num_requests_running
BACKEND_ONLY = (
    "\n".join(
        line
        for line in HOSTED_VLLM.splitlines()
        if "nv_inference" not in line and "num_requests_running" not in line
    )
    + "\n"
)


def test_vllm_backend_page_without_tritons_families_takes_the_model_from_its_labels() -> None:
    exposition = textformat.parse(BACKEND_ONLY.encode())
    assert engines.detect(exposition) == "vllm"
    assert engines.hosted_in(exposition, "vllm") == "triton"
    families = engines.normalize(exposition, "vllm", {"model": "unknown"})
    identities = {
        (s.labels["model"], s.labels["model_version"]) for f in families for s in f.samples
    }
    assert identities == {("vllm_model", "1")}
    assert {f.name for f in families} >= {
        "inferwatch_engine_prompt_tokens",
        "inferwatch_engine_time_to_first_token_seconds",
    }


def test_scrape_names_the_model_of_a_vllm_backend_page(page_server: Any) -> None:
    page_server.page = BACKEND_ONLY.encode()
    result = CliRunner().invoke(main, ["scrape", f"{page_server.url}/page/metrics"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].split() == ["engine:", "vllm", "model:", "vllm_model"]


def test_a_vllm_page_beside_tritons_families_keeps_its_own_labels() -> None:
    """vLLM's own server scraped on a page that also has ``nv_*`` families (two exporters
    merged behind one URL): its ``model_name`` still names the model."""
    page = HOSTED_VLLM.replace('vllm:prompt_tokens_total{model="vllm_model",version="1"}',
                               'vllm:prompt_tokens_total{model_name="tiny"}')  # fmt: skip
    page = "\n".join(line for line in page.splitlines() if "vllm_model" not in line
                     or line.startswith("nv_")) + "\n"  # fmt: skip
    exposition = textformat.parse(page.encode())
    assert engines.hosted_in(exposition, "vllm") is None
    families = engines.normalize(exposition, "vllm", {"model": "unknown"})
    assert {s.labels["model"] for f in families for s in f.samples} == {"tiny"}


def test_vllm_served_by_itself_keeps_model_name() -> None:
    page = HOSTED_VLLM.replace('model="vllm_model",version="1"', 'model_name="tiny"')
    page = "\n".join(line for line in page.splitlines() if "nv_inference" not in line) + "\n"
    exposition = textformat.parse(page.encode())
    assert engines.hosted_in(exposition, "vllm") is None
    families = engines.normalize(exposition, "vllm", {"model_version": "unknown"})
    identities = {
        (s.labels["model"], s.labels["model_version"]) for f in families for s in f.samples
    }
    assert identities == {("tiny", "unknown")}


#: Triton's documented time-to-first-response histogram: its HELP and TYPE lines name
#: ``nv_first_response_histogram_ms`` while its samples are
#: ``nv_inference_first_response_histogram_ms``, the buckets without ``_bucket`` (values ours)
MISNAMED = "nv_inference_first_response_histogram_ms"
MISNAMED_PAGE = f"""\
# HELP nv_first_response_histogram_ms Duration from request to first response in milliseconds
# TYPE nv_first_response_histogram_ms histogram
{MISNAMED}_count{{model="my_model",version="1"}} 20
{MISNAMED}_sum{{model="my_model",version="1"}} 5000
{MISNAMED}{{model="my_model",version="1", le="100"}} 4
{MISNAMED}{{model="my_model",version="1", le="500"}} 15
{MISNAMED}{{model="my_model",version="1", le="+Inf"}} 20
"""


def test_a_histogram_under_another_name_than_its_type_line_is_read_counted_and_logged(
    page_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    page_server.page = MISNAMED_PAGE.encode()
    scraper = EngineScraper(f"{page_server.url}/page/metrics", timeout_s=5)
    collector = EngineCollector(scraper, {})

    async def scrape_twice() -> tuple[list[Metric], list[Metric]]:
        first = list(await collector.collect())
        second = list(await collector.collect())
        await collector.aclose()
        return first, second

    with caplog.at_level(logging.WARNING, logger="inferwatch.engine"):
        first, second = asyncio.run(scrape_twice())
    for families in (first, second):  # the first scrape parses all, the next what is read
        (ttft,) = families
        assert ttft.name == "inferwatch_engine_time_to_first_token_seconds"
        series = {(s.name, s.labels.get("le")): s.value for s in ttft.samples}
        assert series == {
            (f"{ttft.name}_bucket", "0.1"): 4,
            (f"{ttft.name}_bucket", "0.5"): 15,
            (f"{ttft.name}_bucket", "+Inf"): 20,
            (f"{ttft.name}_count", None): 20,
            (f"{ttft.name}_sum", None): 5.0,
        }
        assert {s.labels["model"] for s in ttft.samples} == {"my_model"}
    assert collector.identity["model"] == "my_model"
    (problems,) = (f for f in collector.status_families() if "parse_errors" in f.name)
    counted = {s.labels["family"]: s.value for s in problems.samples}
    assert counted == {"": 0, MISNAMED: 2}  # each scrape that met it
    logged = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    assert [event["family"] for event in logged if "family" in event] == [MISNAMED]


def test_scrape_shows_a_misnamed_histogram_and_its_model(page_server: Any) -> None:
    page_server.page = MISNAMED_PAGE.encode()
    result = CliRunner().invoke(main, ["scrape", f"{page_server.url}/page/metrics"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["engine:", "triton", "model:", "my_model"]
    (row,) = [line for line in lines if "time_to_first_token" in line]
    assert "count=20 mean=0.25" in row


def test_a_rebuilt_histogram_passes_the_same_checks_as_any_other() -> None:
    """Rebuilt under its samples' name, a histogram whose buckets fall is dropped whole as
    malformed, as a well-named one would be, and still counted as misnamed."""
    page = MISNAMED_PAGE.replace('le="500"} 15', 'le="500"} 2')
    assert 'le="500"} 2' in page
    exposition = textformat.parse(page.encode())
    checks = PageChecks()
    checks.apply(exposition, engines.wanted("triton"))
    assert checks.misnamed == {MISNAMED: 1}
    assert checks.dropped == {"malformed": 1}
    assert engines.normalize(exposition, "triton", {}) == []
