"""The simulator's /metrics and GPU endpoint against real vLLM and dcgm-exporter captures."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from inferwatch.capacity import planner as cap
from inferwatch.sim.gpu import GPU_IDLE, POWER_CAP, SimulatedGPU, render_dcgm
from inferwatch.sim.server import SimHandle, run_in_thread
from inferwatch.sim.simulator import SimConfig
from support.shared import shared_path

pytestmark = pytest.mark.unit

VLLM_FIXTURE = shared_path("fixtures/engines/vllm-generated-0.33.0-1engine.prom")
DCGM_FIXTURES = sorted(shared_path("fixtures/gpu/dcgm").glob("*.prom"))
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DCGM_IDENTITY = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                 "DCGM_FI_DRIVER_VERSION"}  # fmt: skip


def shape(text: str) -> dict[str, tuple[str, frozenset[str], tuple[str, ...]]]:
    """Family -> (type, label names, bucket bounds), parsed by prometheus_client."""
    out = {}
    for family in text_string_to_metric_families(text):
        labels = frozenset(
            k for s in family.samples for k in s.labels if k not in ("le", "quantile")
        )
        bounds = tuple(dict.fromkeys(s.labels["le"] for s in family.samples if "le" in s.labels))
        out[family.name] = (family.type, labels, bounds)
    return out


def samples(text: str, name: str) -> list[Sample]:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def value(text: str, name: str, missing: float | None = None, **labels: str) -> float:
    """Sum of the matching samples; ``missing`` when there are none (default: fail)."""
    # a counter family not ending in _total (DCGM) is parsed with "_total" added to its samples
    found = [s.value for f in text_string_to_metric_families(text) for s in f.samples
             if name in (s.name, f.name) and labels.items() <= s.labels.items()]  # fmt: skip
    if not found and missing is not None:
        return missing
    assert found, f"no {name} {labels}"
    return sum(found)


def chat(url: str, content: str, max_tokens: int = 8) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with run_in_thread(SimConfig(port=0, speed=50, gpu_port=0)) as handle:
        yield handle


def test_families_are_identical_to_vllm_0_33(sim: SimHandle) -> None:
    assert chat(sim.url, "hello").status_code == 200
    assert (
        httpx.post(sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code
        == 200
    )
    ours = shape(httpx.get(sim.url + "/metrics").text)
    real = shape(VLLM_FIXTURE.read_text(encoding="utf-8"))
    assert sorted(ours) == sorted(real)
    for name, (kind, labels, bounds) in real.items():
        assert ours[name][0] == kind, name
        assert ours[name][1] == labels, name
        assert ours[name][2] == bounds, name


def test_content_type_and_family_order_match_vllm(sim: SimHandle) -> None:
    reply = httpx.get(sim.url + "/metrics")
    assert reply.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    ours = [line.split()[2] for line in reply.text.splitlines() if line.startswith("# TYPE vllm:")]
    real = [line.split()[2] for line in VLLM_FIXTURE.read_text().splitlines()
            if line.startswith("# TYPE vllm:")]  # fmt: skip
    assert ours == real


def test_tokens_are_counted_once_and_match_usage(sim: SimHandle) -> None:
    before = httpx.get(sim.url + "/metrics").text
    replies = [chat(sim.url, f"count me {i}", max_tokens=7).json() for i in range(3)]
    after = httpx.get(sim.url + "/metrics").text
    prompt = sum(r["usage"]["prompt_tokens"] for r in replies)
    completion = sum(r["usage"]["completion_tokens"] for r in replies)

    def delta(name: str, **labels: str) -> float:
        # a labelled series appears with its first request: absent before means zero
        return value(after, name, **labels) - value(before, name, missing=0.0, **labels)

    assert delta("vllm:generation_tokens_total") == completion == 21
    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:request_success_total", finished_reason="length") == 3
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:inter_token_latency_seconds_count") == completion - 3
    assert delta("vllm:e2e_request_latency_seconds_count") == 3
    assert delta("http_requests_total", handler="/v1/chat/completions", status="2xx") == 3


def test_repeated_prefix_hits_the_prefix_cache(sim: SimHandle) -> None:
    system = "You are the on-call assistant of a very large inference fleet. " * 20
    for question in ("first question?", "second question?"):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        body = {"model": MODEL, "max_tokens": 2, "messages": messages}
        reply = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()
    cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 200
    text = httpx.get(sim.url + "/metrics").text
    assert value(text, "vllm:prefix_cache_hits_total") >= cached
    assert value(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") >= cached


def test_cache_config_info_reports_the_capacity_model(sim: SimHandle) -> None:
    info = samples(httpx.get(sim.url + "/metrics").text, "vllm:cache_config_info")
    assert len(info) == 1
    expected = sim.simulator.capacity
    assert info[0].labels["num_gpu_blocks"] == str(expected.num_blocks)
    assert info[0].labels["block_size"] == "16"
    assert info[0].labels["gpu_memory_utilization"] == "0.92"


def test_engine_ranks_are_engine_label_values() -> None:
    with run_in_thread(SimConfig(port=0, speed=50, engine_ranks=3)) as handle:
        for i in range(6):
            assert chat(handle.url, f"spread {i}", max_tokens=2).status_code == 200
        text = httpx.get(handle.url + "/metrics").text
    ranks = {s.labels["engine"] for s in samples(text, "vllm:generation_tokens_total")}
    assert ranks == {"0", "1", "2"}
    assert {s.labels["engine"] for s in samples(text, "vllm:cache_config_info")} == ranks
    per_rank = [
        value(text, "vllm:request_success_total", engine=r, finished_reason="length") for r in ranks
    ]
    assert sum(per_rank) == 6 and min(per_rank) >= 1  # the least-loaded rank takes each request


def test_gpu_endpoint_speaks_dcgm_exporter(sim: SimHandle) -> None:
    for url in (sim.url + "/gpu/metrics", sim.gpu_url):
        text = httpx.get(url).text
        ours = shape(text)
        for fixture in DCGM_FIXTURES:
            for name, (kind, labels, _) in shape(fixture.read_text(encoding="utf-8")).items():
                if name == "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL":
                    continue  # PCIe-only boards report none (the L4 capture omits it too)
                assert ours[name][0] == kind, name
                assert ours[name][1] == (labels & DCGM_IDENTITY) | (
                    {"err_code", "err_msg"} & labels
                ), name
        for field in ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING"):
            assert field in ours
        power = (
            r'^DCGM_FI_DEV_POWER_USAGE\{gpu="0",UUID="GPU-[0-9a-f-]{36}",pci_bus_id="[0-9A-F:.]+",'
            r'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="inferwatch-sim",'
            r'DCGM_FI_DRIVER_VERSION="[\d.]+"\} \d+\.\d{6}$'
        )
        assert re.search(power, text, re.M)
        assert re.search(r"^DCGM_FI_DEV_FB_USED\{.*\} \d+$", text, re.M)
        assert 'err_code="0",err_msg="No Error"' in text


def test_gpu_readings_follow_load() -> None:
    spec = cap.gpu_preset("H200")
    gpu = SimulatedGPU(
        0, spec, "GPU-x", "h", allocated_bytes=100 * cap.GIB, activation_bytes=5 * cap.GIB
    )
    idle = gpu.values()
    assert idle["DCGM_FI_DEV_GPU_UTIL"] == 0
    assert idle["DCGM_FI_DEV_POWER_USAGE"] == spec.idle_watts
    assert idle["DCGM_FI_DEV_SM_CLOCK"] == spec.idle_sm_clock_mhz
    t = 0.0
    while t < 10:  # ten seconds of back-to-back prefill steps
        gpu.record_step(t, t + 0.1, compute_share=0.9, load=1.0)
        t += 0.1
    busy = gpu.values()
    assert busy["DCGM_FI_DEV_GPU_UTIL"] >= 99
    assert 600 < busy["DCGM_FI_DEV_POWER_USAGE"] <= spec.tdp_watts
    assert busy["DCGM_FI_DEV_GPU_TEMP"] > idle["DCGM_FI_DEV_GPU_TEMP"] + 10
    assert spec.idle_sm_clock_mhz < busy["DCGM_FI_DEV_SM_CLOCK"] < spec.max_sm_clock_mhz
    assert busy["DCGM_FI_DEV_FB_USED"] > idle["DCGM_FI_DEV_FB_USED"]
    assert busy["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] > 10 * 500 * 1000  # mJ
    gpu.settle(t + 30)
    cooled = gpu.values()
    assert cooled["DCGM_FI_DEV_GPU_UTIL"] == 0
    assert cooled["DCGM_FI_DEV_GPU_TEMP"] < busy["DCGM_FI_DEV_GPU_TEMP"] - 10
    assert cooled["DCGM_FI_DEV_FB_USED"] == idle["DCGM_FI_DEV_FB_USED"]


def test_served_load_moves_the_gpu_endpoint() -> None:
    with run_in_thread(SimConfig(port=0, speed=5)) as handle:
        before = httpx.get(handle.url + "/gpu/metrics").text
        assert chat(handle.url, "keep the GPU busy", max_tokens=60).status_code == 200
        after = httpx.get(handle.url + "/gpu/metrics").text
    assert value(after, "DCGM_FI_DEV_GPU_UTIL") > value(before, "DCGM_FI_DEV_GPU_UTIL") == 0
    assert value(after, "DCGM_FI_DEV_POWER_USAGE") > value(before, "DCGM_FI_DEV_POWER_USAGE")


def test_clock_event_reasons_say_what_holds_the_clocks_down() -> None:
    """As the H200 recording shows: gpu_idle at the idle clock, no reason at full clocks
    under a load below the power limit, power_cap with clocks below the maximum at it."""
    spec = cap.gpu_preset("H200")
    gpu = SimulatedGPU(0, spec, "GPU-x", "h", allocated_bytes=cap.GIB, activation_bytes=cap.GIB)
    idle = gpu.values()
    assert idle["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == GPU_IDLE
    assert idle["DCGM_FI_DEV_SM_CLOCK"] == spec.idle_sm_clock_mhz
    t = 0.0
    while t < 10:  # decode: short memory-bound steps, half the time busy
        gpu.record_step(t, t + 0.05, compute_share=0.1, load=0.3)
        t += 0.1
    decoding = gpu.values()
    assert decoding["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0
    assert decoding["DCGM_FI_DEV_SM_CLOCK"] == spec.max_sm_clock_mhz
    assert decoding["DCGM_FI_DEV_POWER_USAGE"] < 0.95 * spec.tdp_watts
    while t < 20:  # back-to-back prefill: the draw reaches the limit
        gpu.record_step(t, t + 0.1, compute_share=1.0, load=1.0)
        t += 0.1
    capped = gpu.values()
    assert capped["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == POWER_CAP
    assert capped["DCGM_FI_DEV_SM_CLOCK"] < spec.max_sm_clock_mhz
    assert capped["DCGM_FI_DEV_POWER_USAGE"] <= capped["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"]
    gpu.settle(t + 30)
    assert gpu.values()["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == GPU_IDLE


def test_gpu_page_has_limits_thresholds_and_nvlink_where_the_board_has_it() -> None:
    """The power limit and the thermal thresholds on every board; NVLink error counters (0)
    on an SXM board, and none at all on a PCIe one, whose NVLink fields DCGM leaves blank."""
    boards = {
        name: SimulatedGPU(0, cap.gpu_preset(name), f"GPU-{name}", "h", cap.GIB, cap.GIB)
        for name in ("H100", "L40S")
    }
    text = {name: render_dcgm([gpu], 0.0) for name, gpu in boards.items()}
    for name, page in text.items():
        spec = boards[name].spec
        assert value(page, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT") == spec.tdp_watts
        assert value(page, "DCGM_FI_DEV_SLOWDOWN_TEMP") == spec.slowdown_temp_c
        assert value(page, "DCGM_FI_DEV_SHUTDOWN_TEMP") == spec.shutdown_temp_c
        assert re.search(r"^DCGM_FI_DEV_ENFORCED_POWER_LIMIT\{.*\} \d+\.\d{6}$", page, re.M)
        assert re.search(r"^DCGM_FI_DEV_SLOWDOWN_TEMP\{.*\} \d+$", page, re.M)
    nvlink = [
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    ]
    assert all(shape(text["H100"])[f][0] == "counter" for f in nvlink)
    assert all(value(text["H100"], f) == 0 for f in nvlink)
    assert not [f for f in nvlink if f in text["L40S"]]  # not even a HELP line
