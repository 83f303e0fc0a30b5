"""Engine adapters: real engine pages in, catalogue families out.

Fixtures are real captures (../shared/fixtures/engines/, each with its .source.txt). Where no
capture carries a signal (llama.cpp has no stored scrape; the TGI capture is trimmed; the
Triton capture has only TensorRT-LLM gauges; the SGLang capture predates its rank labels),
a page is written here with the engines' real names, labels and bucket rules from
/work/shared/reference/engines.md, and says so.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from inferwatch import catalog
from inferwatch.catalog import Alias
from inferwatch.exporters.engine import adapters as engines
from inferwatch.exporters.engine.adapters import adapter, mapping
from inferwatch.serving import textformat
from support.shared import shared_path

pytestmark = pytest.mark.proc

HERE = Path(__file__).resolve().parent
FIXTURES = shared_path("fixtures/engines")
GOLDEN = HERE / "golden" / "engines"
PAGES = sorted(FIXTURES.glob("*.prom"))
CAT = catalog.load()
ENGINE_KEYS = {spec.key for spec in CAT.by_collector("engine")}
IDENTITY = {
    "model": "fixture-model",
    "model_version": "",
    "engine_version": "test",
    "prompt_version": "",
    "pod": "pod-0",
    "namespace": "serving",
    "node": "node-a",
}
VLLM_1 = (FIXTURES / "vllm-generated-0.33.0-1engine.prom").read_text()
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


class _Families:
    """The smallest thing generate_latest accepts: an object with collect()."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def render(families: list[Metric]) -> str:
    return generate_latest(_Families(families)).decode()  # type: ignore[arg-type]


def normalized(text: str, engine: str | None = None, **identity: str) -> list[Metric]:
    exposition = textformat.parse(text)
    engine = engine or engines.detect(exposition)
    assert engine is not None
    return engines.normalize(exposition, engine, {**IDENTITY, "engine": engine, **identity})


def series(families: Iterable[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every output sample by (name, labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families
        for s in family.samples
    }


def value(families: Iterable[Metric], name: str, **labels: str) -> float:
    """The one sample named ``name`` whose labels include ``labels``."""
    found = [
        s.value
        for family in families
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def keys(families: Iterable[Metric]) -> set[str]:
    names = {family.name: key for key, spec in CAT.items() for family in [spec.new_family()]}
    return {names[family.name] for family in families}


def buckets(families: Iterable[Metric], name: str) -> list[tuple[str, float]]:
    return [
        (s.labels["le"], s.value)
        for family in families
        for s in family.samples
        if s.name == name + "_bucket"
    ]


def histogram_text(
    name: str,
    labels: str,
    bounds: list[str],
    counts: list[float],
    total: float,
    typed: bool = True,
) -> str:
    """One histogram series as exposition text; ``labels`` like 'a="b",'. ``typed=False``
    leaves out the # TYPE line, for a further series of a family already declared."""
    lines = [f"# TYPE {name} histogram"] if typed else []
    for bound, count in zip([*bounds, "+Inf"], counts, strict=True):
        lines.append(f'{name}_bucket{{{labels}le="{bound}"}} {count}')
    plain = f"{{{labels.rstrip(',')}}}" if labels else ""
    lines += [f"{name}_count{plain} {counts[-1]}", f"{name}_sum{plain} {total}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Pages written here (no stored capture carries these signals); names from engines.md
# ---------------------------------------------------------------------------------------------

# llama.cpp: no capture is stored anywhere (engines.md §11). Families and HELP texts of a 2026
# llama-server --metrics build (tools/server README "Available metrics", server-task.cpp).
LLAMACPP_PAGE = """\
# HELP llamacpp:prompt_tokens_total Total prompt processing tokens (excluding cached tokens).
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 12345
# HELP llamacpp:prompt_tokens_cached_total Total prompt processing tokens (cached tokens).
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 678
# HELP llamacpp:prompt_seconds_total Total time spent on prompt processing.
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 12.345
# HELP llamacpp:tokens_predicted_total Total predicted tokens.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 987
# HELP llamacpp:tokens_predicted_seconds_total Total time spent on token prediction.
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 19.74
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 990
# HELP llamacpp:n_tokens_max Largest observed n_tokens.
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 4096
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 1000.04
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 50.0
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1.5
# HELP llamacpp:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 100
# HELP llamacpp:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 300
# HELP llamacpp:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 150
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 80
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 50
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 20
"""

# TGI: the stored capture keeps only the first 13 families. The trimmed families are rebuilt
# with the router's real bucket rule (every *duration: 0.0001 * 1.5**k, k = 1..35).
TGI_DURATION_BOUNDS = [repr(0.0001 * 1.5**k) for k in range(1, 36)]


def _tgi_duration(name: str, labels: str, cut: int, count: float, total: float) -> str:
    counts = [0.0] * cut + [count] * (36 - cut)
    return histogram_text(name, labels, TGI_DURATION_BOUNDS, counts, total)


TGI_PAGE = (
    (FIXTURES / "tgi-datadog-payload.prom").read_text()
    + _tgi_duration("tgi_request_duration", "", 25, 109, 260.5)
    + _tgi_duration("tgi_request_queue_duration", "", 5, 109, 0.25)
    + _tgi_duration("tgi_request_mean_time_per_token_duration", "", 10, 109, 2.9)
    + _tgi_duration("tgi_batch_inference_duration", 'method="prefill",', 15, 16, 1.6)
    + _tgi_duration("tgi_batch_inference_duration", 'method="decode",', 10, 1509, 240.0)
    + histogram_text(
        "tgi_request_generated_tokens",
        "",
        [repr(512 / 100 * (i + 1)) for i in range(3)],
        [0, 9, 109, 109],
        2616,
    )
)

# Triton core, no TensorRT-LLM backend: per-model counters in microseconds and the opt-in
# first-response histogram in milliseconds (docs/user_guide/metrics.md, default buckets).
TRITON_CORE_PAGE = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="tensorrt_llm",version="1"} 161
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="tensorrt_llm",reason="REJECTED",version="1"} 2
nv_inference_request_failure{model="tensorrt_llm",reason="CANCELED",version="1"} 0
nv_inference_request_failure{model="tensorrt_llm",reason="BACKEND",version="1"} 1
nv_inference_request_failure{model="tensorrt_llm",reason="OTHER",version="1"} 0
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="tensorrt_llm",version="1"} 161
# HELP nv_inference_exec_count Number of model executions performed
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="tensorrt_llm",version="1"} 90
# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{model="tensorrt_llm",version="1"} 48300300
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="tensorrt_llm",version="1"} 11110
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 3
# HELP nv_inference_first_response_histogram_ms Duration to first response in milliseconds
""" + histogram_text(
    "nv_inference_first_response_histogram_ms",
    'model="tensorrt_llm",version="1",',
    ["100", "500", "2000", "5000"],
    [20, 130, 158, 161, 161],
    48300,
)

# SGLang as current code writes it (engines.md §4): scheduler series per rank with
# engine_type/tp_rank/pp_rank/moe_ep_rank, here from two tensor-parallel ranks of one
# scheduler (--enable-metrics-for-all-schedulers) that both see the same batch; request
# series split by is_streaming; cache geometry as labels of sglang:cache_config_info.
_RANK = 'engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="{}"'
SGLANG_PAGE = (
    "".join(
        f"# TYPE sglang:{name} gauge\n"
        + "".join(f"sglang:{name}{{{_RANK.format(tp)}}} {v}\n" for tp in (0, 1))
        for name, v in (
            ("num_running_reqs", 7),
            ("num_queue_reqs", 3),
            ("token_usage", 0.41),
            ("kv_cache_usage_perc", 0.4),
        )
    )
    + "# TYPE sglang:cache_config_info gauge\n"
    + "".join(
        f'sglang:cache_config_info{{{_RANK.format(tp)},num_pages="500000",page_size="1"}} 1\n'
        for tp in (0, 1)
    )
    + """\
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{is_streaming="false",model_name="qwen"} 4000
sglang:prompt_tokens_total{is_streaming="true",model_name="qwen"} 96
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{is_streaming="false",model_name="qwen"} 900
sglang:generation_tokens_total{is_streaming="true",model_name="qwen"} 100
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="qwen"} 3000
sglang:cached_tokens_total{cache_source="host",model_name="qwen"} 168
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{is_streaming="false",model_name="qwen"} 40
sglang:num_requests_total{is_streaming="true",model_name="qwen"} 2
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{model_name="qwen"} 1
"""
    + "".join(
        histogram_text(
            f"sglang:{name}",
            f'is_streaming="{streaming}",model_name="qwen",',
            bounds,
            counts,
            total,
            typed=streaming == "false",
        )
        for name, bounds, counts, total in (
            ("time_to_first_token_seconds", ["0.1", "0.2", "0.4"], [1, 5, 20, 21], 6.0),
            ("e2e_request_latency_seconds", ["0.1", "0.2", "0.4"], [0, 1, 10, 21], 9.5),
            ("queue_time_seconds", ["0.1", "0.2", "0.4"], [15, 20, 21, 21], 0.9),
            ("prompt_tokens_histogram", ["100", "300", "1000"], [1, 11, 21, 21], 2048),
            ("generation_tokens_histogram", ["100", "300", "1000"], [20, 21, 21, 21], 500),
            ("inter_token_latency_seconds", ["0.002", "0.005", "0.01"], [0, 100, 480, 500], 3.1),
        )
        for streaming in ("false", "true")
    )
)

# vLLM before 0.12 (V0 and early V1): the names renamed since (engines.md §2.2).
VLLM_RENAMED = (
    """\
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="old"} 0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="old"} 0.55
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="old"} 0.0
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="old"} 1000
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="old"} 250
"""
    + histogram_text(
        "vllm:time_per_output_token_seconds",
        'model_name="old",',
        ["0.01", "0.025", "0.05"],
        [5, 50, 90, 100],
        3.0,
    )
    + histogram_text(
        "vllm:time_in_queue_requests", 'model_name="old",', ["0.3", "0.5"], [8, 9, 10], 1.5
    )
)
VLLM_V0_PAGE = (
    '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="old"} 3\n'
    + VLLM_RENAMED
)


# ---------------------------------------------------------------------------------------------
# Goldens of the real captures
# ---------------------------------------------------------------------------------------------


def _engine_of(page: Path) -> str:
    return page.name.split("-", 1)[0]


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_fixture_golden_and_promtool(
    page: Path, golden: Callable[[Path, str], None], promtool: str
) -> None:
    exposition = textformat.parse(page.read_bytes())
    engine = engines.detect(exposition)
    assert engine == _engine_of(page)
    families = engines.normalize(exposition, engine, {**IDENTITY, "engine": engine})
    assert families, "every capture maps to some signals"
    text = render(families)
    golden(GOLDEN / page.name, text)
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert (check.returncode, check.stdout + check.stderr) == (0, "")


def test_vllm_032_mapped_golden_passes_promtool(promtool: str) -> None:
    """The mapped real vLLM 0.32 page (written by test_engines_vllm032.py)."""
    page = HERE / "golden" / "vllm-0.32.0-cpu-tiny.mapped.prom"
    check = subprocess.run(
        [promtool, "check", "metrics"], input=page.read_bytes(), capture_output=True, check=False
    )
    assert (check.returncode, check.stdout + check.stderr) == (0, b"")


def test_vllm_capture_values() -> None:
    families = normalized(VLLM_1)
    model = {"model": LLAMA}
    assert value(families, "inferwatch_engine_requests_running", **model) == 9
    assert value(families, "inferwatch_engine_requests_waiting", **model) == 4
    assert value(families, "inferwatch_engine_kv_cache_usage_ratio", **model) == pytest.approx(
        0.18887679786592518
    )
    assert value(families, "inferwatch_engine_prompt_tokens_total", **model) == 203797
    assert value(families, "inferwatch_engine_requests_finished_total", reason="stop") == 26
    assert value(families, "inferwatch_engine_requests_finished_total", reason="length") == 14
    assert value(families, "inferwatch_engine_request_errors_total", reason="error") == 0
    assert value(families, "inferwatch_engine_prefix_cache_hit_tokens_total") == 52043
    # cache geometry comes from labels of vllm:cache_config_info, which has no model_name:
    # it is given the one model the page's other series name, not the caller's default
    assert value(families, "inferwatch_engine_kv_cache_block_size_tokens", **model) == 16
    assert value(families, "inferwatch_engine_kv_cache_blocks", **model) == 27000
    two_models = VLLM_1.replace(
        'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0',
        'vllm:num_requests_running{engine="0",model_name="a"} 4.0\n'
        'vllm:num_requests_running{engine="1",model_name="b"} 5.0',
    )
    blocks = normalized(two_models)
    assert value(blocks, "inferwatch_engine_kv_cache_blocks", model="fixture-model") == 27000
    # identity labels the engine does not carry come from the caller
    running = families[0].samples[0].labels
    assert running["engine"] == "vllm" and running["pod"] == "pod-0" and running["node"] == "node-a"


def test_vllm_histograms_keep_source_buckets_and_sum() -> None:
    families = normalized(VLLM_1)
    source = {
        f.name: f
        for f in text_string_to_metric_families(VLLM_1)
        if f.name == "vllm:time_to_first_token_seconds"
    }["vllm:time_to_first_token_seconds"]
    expected = [
        (float(s.labels["le"]), s.value) for s in source.samples if s.name.endswith("_bucket")
    ]
    got = buckets(families, "inferwatch_engine_time_to_first_token_seconds")
    assert [(float(le), n) for le, n in got] == expected
    assert got[-1][0] == "+Inf"
    source_sum = next(s.value for s in source.samples if s.name.endswith("_sum"))
    assert value(families, "inferwatch_engine_time_to_first_token_seconds_sum") == source_sum


def test_absent_signals_yield_no_family() -> None:
    produced = keys(normalized(VLLM_1))  # speculative decoding is off in this capture
    assert not {k for k in produced if k.startswith("engine_spec_decode")}
    with_spec = keys(normalized((FIXTURES / "vllm-generated-0.33.0-specdec-lora.prom").read_text()))
    assert {"engine_spec_decode_drafts", "engine_spec_decode_position_accepted_tokens"} <= with_spec


def test_speculative_decoding_counters() -> None:
    families = normalized((FIXTURES / "vllm-generated-0.33.0-specdec-lora.prom").read_text())
    assert value(families, "inferwatch_engine_spec_decode_drafts_total") == 65140
    assert value(families, "inferwatch_engine_spec_decode_draft_tokens_total") == 195420
    assert value(families, "inferwatch_engine_spec_decode_accepted_tokens_total") == 104368
    per_position = [
        value(families, "inferwatch_engine_spec_decode_position_accepted_tokens_total", position=p)
        for p in "012"
    ]
    assert per_position == [51959, 34434, 17975]


def test_histogram_without_sum_is_left_out() -> None:
    """The vLLM design doc's example elides TTFT's +Inf bucket and _sum: no valid histogram."""
    families = normalized((FIXTURES / "vllm-docs-design-metrics.prom").read_text())
    assert "engine_time_to_first_token" not in keys(families)
    assert value(families, "inferwatch_engine_requests_finished_total", reason="length") == 131


def test_triton_trtllm_gauges_are_selected_by_label() -> None:
    families = normalized((FIXTURES / "triton-trtllm-backend-readme-ifb.prom").read_text())
    labels = {"model": "tensorrt_llm", "model_version": "1"}
    assert value(families, "inferwatch_engine_requests_running", **labels) == 0  # active
    assert value(families, "inferwatch_engine_requests_waiting", **labels) == 1
    assert value(families, "inferwatch_engine_kv_cache_usage_ratio", **labels) == 0.4875
    assert value(families, "inferwatch_engine_kv_cache_block_size_tokens", **labels) == 64
    assert value(families, "inferwatch_engine_kv_cache_blocks", **labels) == 6239


def test_tgi_counters_without_total_and_token_sums() -> None:
    families = normalized((FIXTURES / "tgi-datadog-payload.prom").read_text())
    assert value(families, "inferwatch_engine_requests_finished_total", reason="") == 109
    assert value(families, "inferwatch_engine_request_errors_total", reason="validation") == 2
    assert value(families, "inferwatch_engine_prompt_tokens_total", model="fixture-model") == 662
    assert value(families, "inferwatch_engine_request_prompt_tokens_count") == 109


# ---------------------------------------------------------------------------------------------
# Data parallelism and aliases
# ---------------------------------------------------------------------------------------------


def ranks_page(ranks: int) -> str:
    """The 1-engine capture as a data-parallel server: each vLLM series once per ``engine``
    rank, rank r's values multiplied by r + 1 (buckets stay cumulative)."""
    out = []
    for line in VLLM_1.splitlines():
        if line.startswith("#") or 'engine="0"' not in line:
            out.append(line)
            continue
        head, number = line.rsplit(" ", 1)
        for rank in range(ranks):
            scaled = float(number) * (rank + 1)
            out.append(head.replace('engine="0"', f'engine="{rank}"') + f" {scaled!r}")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("ranks", [2, 4])
def test_data_parallel_ranks_sum_counts_and_take_max_kv(ranks: int) -> None:
    one = series(normalized(VLLM_1))
    many = series(normalized(ranks_page(ranks)))
    assert many.keys() == one.keys()
    summed = ranks * (ranks + 1) / 2
    for (name, labels), base in one.items():
        if name in ("inferwatch_engine_kv_cache_usage_ratio", "inferwatch_engine_sleep_state"):
            expected = base * ranks  # the fullest rank (any rank asleep), not a sum
        elif name == "inferwatch_engine_kv_cache_block_size_tokens":
            expected = base  # a label value, identical on every rank
        elif name in ("inferwatch_engine_http_requests_total",
                      "inferwatch_engine_admission_rejections_total"):  # fmt: skip
            expected = base  # the API server's, one series whatever the ranks
        elif name == "inferwatch_engine_kv_cache_blocks":
            expected = base * ranks  # label values, each rank has its own blocks
        else:
            expected = base * summed  # gauges, counters, every histogram bucket, sum, count
        assert many[name, labels] == pytest.approx(expected), (name, labels)


def test_ranks_with_different_buckets_keep_the_common_boundaries() -> None:
    page = histogram_text(
        "vllm:e2e_request_latency_seconds",
        'engine="0",model_name="m",',
        ["0.5", "1.0", "2.0"],
        [1, 2, 3, 4],
        5.0,
    ) + histogram_text(
        "vllm:e2e_request_latency_seconds",
        'engine="1",model_name="m",',
        ["1.0", "5.0"],
        [10, 20, 30],
        50.0,
        typed=False,
    )
    families = normalized(page, "vllm")
    assert buckets(families, "inferwatch_engine_request_duration_seconds") == [
        ("1.0", 12.0),
        ("+Inf", 34.0),
    ]
    assert value(families, "inferwatch_engine_request_duration_seconds_sum") == 55.0


def test_underscore_spelling_maps_like_the_colon_one() -> None:
    underscored = VLLM_1.replace("vllm:", "vllm_")
    assert engines.detect(textformat.parse(underscored)) == "vllm"
    assert render(normalized(underscored)) == render(normalized(VLLM_1))
    sglang = (FIXTURES / "sglang-docs-production-metrics.prom").read_text()
    assert render(normalized(sglang.replace("sglang:", "sglang_"))) == render(normalized(sglang))


def test_renamed_v0_names_feed_the_same_signals() -> None:
    families = normalized(VLLM_V0_PAGE)
    old = {"model": "old"}
    assert value(families, "inferwatch_engine_kv_cache_usage_ratio", **old) == 0.55
    assert value(families, "inferwatch_engine_prefix_cache_queried_tokens_total", **old) == 1000
    assert value(families, "inferwatch_engine_prefix_cache_hit_tokens_total", **old) == 250
    assert buckets(families, "inferwatch_engine_inter_token_latency_seconds") == [
        ("0.01", 5),
        ("0.025", 50),
        ("0.05", 90),
        ("+Inf", 100),
    ]
    assert value(families, "inferwatch_engine_request_queue_duration_seconds_count") == 10


def test_a_release_showing_old_and_new_names_is_not_counted_twice() -> None:
    """vLLM 0.10/0.11 show deprecated names next to their replacements."""
    both = VLLM_1 + VLLM_RENAMED.replace('model_name="old"', f'engine="0",model_name="{LLAMA}"')
    one, two = series(normalized(VLLM_1)), series(normalized(both))
    assert two == one


def _vllm_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", labels, registry=registry)
    running = Gauge("vllm:num_requests_running", "Running.", labels, registry=registry)
    kv = Gauge("vllm:kv_cache_usage_perc", "KV usage.", labels, registry=registry)
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "TTFT.",
        labels,
        buckets=[0.02, 0.04, 0.1, 1.0],
        registry=registry,
    )
    for engine, load in (("0", 1), ("1", 3)):
        prompt.labels("m", engine).inc(100 * load)
        running.labels("m", engine).set(load)
        kv.labels("m", engine).set(0.1 * load)
        for seconds in (0.01, 0.03, 0.5)[:load]:
            ttft.labels("m", engine).observe(seconds)
    return registry


def test_openmetrics_page_from_a_registry_maps_like_the_text_one() -> None:
    registry = _vllm_registry()
    openmetrics = generate_openmetrics(registry).decode()
    assert openmetrics.rstrip().endswith("# EOF")
    from_text = normalized(generate_latest(registry).decode(), "vllm")
    from_openmetrics = normalized(openmetrics, "vllm")
    assert render(from_openmetrics) == render(from_text)
    assert value(from_openmetrics, "inferwatch_engine_prompt_tokens_total") == 400
    assert value(from_openmetrics, "inferwatch_engine_requests_running") == 4
    assert value(from_openmetrics, "inferwatch_engine_kv_cache_usage_ratio") == pytest.approx(0.3)
    assert buckets(from_openmetrics, "inferwatch_engine_time_to_first_token_seconds") == [
        ("0.02", 2.0),
        ("0.04", 3.0),
        ("0.1", 3.0),
        ("1.0", 4.0),
        ("+Inf", 4.0),
    ]


def test_page_without_type_lines_maps_like_the_typed_one() -> None:
    bare = "".join(line + "\n" for line in VLLM_1.splitlines() if not line.startswith("#"))
    assert render(normalized(bare, "vllm")) == render(normalized(VLLM_1))


def test_family_filter_for_the_parser_keeps_what_normalize_reads() -> None:
    for page in PAGES:
        text = page.read_text()
        engine = _engine_of(page)
        full = engines.normalize(textformat.parse(text), engine, IDENTITY)
        filtered = textformat.parse(text, wanted=engines.wanted(engine))
        assert render(engines.normalize(filtered, engine, IDENTITY)) == render(full)
    kept = textformat.parse(VLLM_1, wanted=engines.wanted("vllm")).families
    assert not [name for name in kept if name.startswith(("python_", "process_", "http_request_"))]
    assert len(kept) < len(textformat.parse(VLLM_1).families) / 2


# ---------------------------------------------------------------------------------------------
# Engines without a full capture
# ---------------------------------------------------------------------------------------------


def test_sglang_tensor_parallel_ranks_are_one_batch() -> None:
    families = normalized(SGLANG_PAGE)
    assert engines.detect(textformat.parse(SGLANG_PAGE)) == "sglang"
    qwen = {"model": "qwen"}
    assert value(families, "inferwatch_engine_requests_running", **qwen) == 7  # not 14
    assert value(families, "inferwatch_engine_requests_waiting", **qwen) == 3
    assert value(families, "inferwatch_engine_kv_cache_usage_ratio", **qwen) == 0.4
    assert value(families, "inferwatch_engine_kv_cache_blocks", **qwen) == 500000
    assert value(families, "inferwatch_engine_kv_cache_block_size_tokens", **qwen) == 1
    assert value(families, "inferwatch_engine_prompt_tokens_total", **qwen) == 4096
    assert value(families, "inferwatch_engine_cached_prompt_tokens_total", **qwen) == 3168
    assert value(families, "inferwatch_engine_requests_finished_total", **qwen) == 42
    assert value(families, "inferwatch_engine_time_to_first_token_seconds_count") == 42
    assert buckets(families, "inferwatch_engine_request_queue_duration_seconds") == [
        ("0.1", 30),
        ("0.2", 40),
        ("0.4", 42),
        ("+Inf", 42),
    ]


def test_sglang_data_parallel_ranks_add_up() -> None:
    page = "# TYPE sglang:num_running_reqs gauge\n" + "".join(
        f'sglang:num_running_reqs{{dp_rank="{dp}",model_name="qwen",tp_rank="{dp * 4}"}} {n}\n'
        for dp, n in ((0, 5), (1, 6))
    )
    assert value(normalized(page), "inferwatch_engine_requests_running") == 11


def test_sglang_total_cache_source_is_not_added_to_its_parts() -> None:
    page = "# TYPE sglang:cached_tokens_total counter\n" + "".join(
        f'sglang:cached_tokens_total{{cache_source="{source}",model_name="qwen"}} {n}\n'
        for source, n in (("device", 30), ("host", 12), ("total", 42))
    )
    assert value(normalized(page), "inferwatch_engine_cached_prompt_tokens_total") == 42


def test_tgi_time_to_first_token_is_queue_plus_prefill() -> None:
    families = normalized(TGI_PAGE)
    name = "inferwatch_engine_time_to_first_token_seconds"
    assert buckets(families, name) == [("+Inf", 109)]  # requests that left the queue
    assert value(families, name + "_sum") == pytest.approx(0.25 + 1.6)
    assert value(families, "inferwatch_engine_request_duration_seconds_count") == 109
    assert value(families, "inferwatch_engine_time_per_output_token_seconds_sum") == 2.9
    assert value(families, "inferwatch_engine_generation_tokens_total") == 2616
    assert len(buckets(families, "inferwatch_engine_request_queue_duration_seconds")) == 36
    without_prefill = TGI_PAGE.replace('method="prefill"', 'method="other"')
    assert "engine_time_to_first_token" not in keys(normalized(without_prefill))


def test_llamacpp_adds_cached_prompt_tokens_back() -> None:
    families = normalized(LLAMACPP_PAGE)
    assert engines.detect(textformat.parse(LLAMACPP_PAGE)) == "llamacpp"
    assert value(families, "inferwatch_engine_prompt_tokens_total") == 12345 + 678
    assert value(families, "inferwatch_engine_cached_prompt_tokens_total") == 678
    assert value(families, "inferwatch_engine_prefix_cache_queried_tokens_total") == 12345 + 678
    assert value(families, "inferwatch_engine_prefix_cache_hit_tokens_total") == 678
    assert value(families, "inferwatch_engine_requests_running", model="fixture-model") == 2
    assert value(families, "inferwatch_engine_requests_waiting") == 1
    itl = "inferwatch_engine_inter_token_latency_seconds"
    assert buckets(families, itl) == [("+Inf", 987)]
    assert value(families, itl + "_sum") == 19.74


def test_llamacpp_before_the_cached_counter() -> None:
    older = re.sub(r"(?m)^.*prompt_tokens_cached.*\n", "", LLAMACPP_PAGE)
    families = normalized(older)
    assert value(families, "inferwatch_engine_prompt_tokens_total") == 12345
    produced = keys(families)
    assert not produced & {"engine_prefix_cache_queried_tokens", "engine_cached_prompt_tokens"}


def test_triton_core_latencies_in_seconds() -> None:
    families = normalized(TRITON_CORE_PAGE)
    assert engines.detect(textformat.parse(TRITON_CORE_PAGE)) == "triton"
    model = {"model": "tensorrt_llm", "model_version": "1"}
    assert value(families, "inferwatch_engine_requests_waiting", **model) == 3
    assert value(families, "inferwatch_engine_request_errors_total", reason="REJECTED") == 2
    assert value(families, "inferwatch_engine_requests_finished_total", **model) == 161
    assert buckets(families, "inferwatch_engine_request_duration_seconds") == [("+Inf", 161)]
    assert value(families, "inferwatch_engine_request_duration_seconds_sum") == 48.3003
    assert value(families, "inferwatch_engine_request_queue_duration_seconds_sum") == 0.01111
    assert buckets(families, "inferwatch_engine_time_to_first_token_seconds") == [
        ("0.1", 20),
        ("0.5", 130),
        ("2.0", 158),
        ("5.0", 161),
        ("+Inf", 161),
    ]
    assert value(families, "inferwatch_engine_time_to_first_token_seconds_sum") == 48.3


SYNTHETIC = {
    "llamacpp": [LLAMACPP_PAGE],
    "tgi": [TGI_PAGE],
    "triton": [TRITON_CORE_PAGE],
    "sglang": [SGLANG_PAGE],
    "vllm": [VLLM_V0_PAGE],
}


@pytest.mark.parametrize("page", [p for pages in SYNTHETIC.values() for p in pages])
def test_written_pages_pass_promtool(page: str, promtool: str) -> None:
    text = render(normalized(page))
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert (check.returncode, check.stdout + check.stderr) == (0, "")


@pytest.mark.parametrize("engine", engines.ENGINES)
def test_every_signal_an_engine_declares_is_produced(engine: str) -> None:
    """Each catalogue alias source and each derivation of the engine shows up on a page."""
    declared = {spec.key for spec in CAT.by_collector("engine") if engine in spec.sources}
    declared |= set(engines._ADAPTERS[engine].derived)
    pages = [p.read_text() for p in PAGES if _engine_of(p) == engine] + SYNTHETIC[engine]
    produced = set().union(*(keys(normalized(page, engine)) for page in pages))
    assert declared <= produced, sorted(declared - produced)
    assert produced <= declared


def test_every_engine_signal_has_a_source() -> None:
    fed = set()
    for engine in engines.ENGINES:
        fed |= {spec.key for spec in CAT.by_collector("engine") if engine in spec.sources}
        fed |= set(engines._ADAPTERS[engine].derived)
        fed |= {"engine_setting"} if engines._ADAPTERS[engine].settings else set()
    assert fed == ENGINE_KEYS


# ---------------------------------------------------------------------------------------------
# Detection and errors
# ---------------------------------------------------------------------------------------------


def _process_page() -> str:
    from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return generate_latest(registry).decode()


DCGM_PAGE = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-5fb0",device="nvidia0",Hostname="n1"} 87
"""


@pytest.mark.parametrize(
    "page",
    ["", "# just a comment\n", DCGM_PAGE, _process_page()],
    ids=["empty", "comment", "dcgm", "python-process"],
)
def test_unknown_pages_are_not_detected(page: str) -> None:
    assert engines.detect(textformat.parse(page)) is None


def test_detection_prefers_tensorrt_llm_gauges_and_ends_with_triton_core() -> None:
    both = (FIXTURES / "triton-trtllm-backend-readme-ifb.prom").read_text() + TRITON_CORE_PAGE
    assert engines.detect(textformat.parse(both)) == "triton"
    vllm_backend = TRITON_CORE_PAGE + 'vllm:num_requests_running{model="m",version="1"} 1\n'
    assert engines.detect(textformat.parse(vllm_backend)) == "vllm"


def test_unknown_engine_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown engine 'ollama'; expected one of vllm"):
        engines.normalize(textformat.parse(VLLM_1), "ollama", IDENTITY)


def test_page_of_another_engine_yields_nothing() -> None:
    assert engines.normalize(textformat.parse(VLLM_1), "tgi", IDENTITY) == []


def test_a_derivation_may_not_shadow_a_catalogue_alias() -> None:
    clash = adapter.Adapter(
        "vllm", derived={"engine_requests_running": adapter.LabelValue("x", "y")}
    )
    with pytest.raises(ValueError, match="engine_requests_running: vllm has both"):
        mapping.plan(CAT, clash)
    unknown = adapter.Adapter("vllm", derived={"engine_nonsense": adapter.Total((Alias("x"),))})
    with pytest.raises(KeyError, match="engine_nonsense"):
        mapping.plan(CAT, unknown)


def test_missing_identity_keys_render_empty() -> None:
    families = engines.normalize(textformat.parse(LLAMACPP_PAGE), "llamacpp", {"pod": "p"})
    labels = families[0].samples[0].labels
    assert labels["pod"] == "p" and labels["model"] == "" and labels["node"] == ""


# ---------------------------------------------------------------------------------------------
# Version endpoints
# ---------------------------------------------------------------------------------------------


def _read_version(engine: str, routes: Mapping[str, httpx.Response | Exception]) -> dict[str, str]:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        answer = routes.get(request.url.path, httpx.Response(404, text="Not Found"))
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def go() -> dict[str, str]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await engines.read_version(client, "http://engine:8000/", engine)

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("engine", "routes", "expected"),
    [
        ("vllm", {"/version": {"version": "0.33.0"}}, {"engine_version": "0.33.0"}),
        (
            "tgi",
            {
                "/info": {
                    "model_id": "bigscience/bloom-560m",
                    "version": "3.3.6-dev0",
                    "max_batch_total_tokens": 512,
                }
            },
            {"engine_version": "3.3.6-dev0", "model": "bigscience/bloom-560m"},
        ),
        (
            "sglang",
            {
                "/get_server_info": {
                    "model_path": "qwen/qwen2.5-0.5b-instruct",
                    "served_model_name": None,
                    "version": "0.5.23",
                }
            },
            {"engine_version": "0.5.23", "model": "qwen/qwen2.5-0.5b-instruct"},
        ),
        ("sglang", {"/version": {"version": "0.5.23"}}, {"engine_version": "0.5.23"}),
        (
            "llamacpp",
            {
                "/props": {
                    "model_path": "models/gemma.gguf",
                    "build_info": "b10173-e9fa0781f",
                    "total_slots": 4,
                }
            },
            {"engine_version": "b10173-e9fa0781f", "model": "models/gemma.gguf"},
        ),
        (
            "triton",
            {"/v2": {"name": "triton", "version": "2.61.0", "extensions": []}},
            {"engine_version": "2.61.0"},
        ),
    ],
    ids=["vllm", "tgi", "sglang", "sglang-old", "llamacpp", "triton"],
)
def test_read_version(engine: str, routes: dict[str, object], expected: dict[str, str]) -> None:
    answers = {path: httpx.Response(200, json=body) for path, body in routes.items()}
    assert _read_version(engine, answers) == expected


@pytest.mark.parametrize(
    "answer",
    [
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("timed out"),
        httpx.Response(200, text="<html>loading</html>"),
        httpx.Response(200, json=["not", "an", "object"]),
        httpx.Response(500, json={"version": "0.33.0"}),
        httpx.Response(200, json={"version": ""}),
    ],
    ids=["refused", "timeout", "html", "list", "status-500", "empty-version"],
)
def test_read_version_is_best_effort(answer: httpx.Response | Exception) -> None:
    assert _read_version("vllm", {"/version": answer}) == {}


def test_read_version_of_unknown_engine() -> None:
    assert _read_version("ollama", {}) == {}
