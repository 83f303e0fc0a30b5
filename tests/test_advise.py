"""``inferwatch advise``: each proposal rule at its boundary, the plan's choice by the capacity
model, and the command's refusals and output against a Prometheus that answers fixed values."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from inferwatch.advise import plan as planning
from inferwatch.advise import rules
from inferwatch.advise.window import Window
from inferwatch.capacity import planner as cap
from inferwatch.capacity import sizing
from inferwatch.cli import main
from inferwatch.exitcodes import ExitCode
from support.advise import MODEL, answering, window
from support.ports import refused_port
from support.stub_prometheus import StubPrometheus, stub_prometheus

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("values", "fires"),
    [
        ({"preemptions": 0, "kv_usage_max": 0.89}, False),
        ({"preemptions": 1, "kv_usage_max": 0.1}, True),
        ({"preemptions": 0, "kv_usage_max": 0.9}, True),
        ({"preemptions": None, "kv_usage_max": None}, False),
    ],
)
def test_memory_bound_from_one_preemption_or_a_cache_90_percent_full(
    values: dict[str, float | None], fires: bool
) -> None:
    assert (rules.memory_bound(window(**values)) is not None) is fires


@pytest.mark.parametrize(
    ("values", "fires"),
    [
        ({"queue_mean": 0.25}, True),  # 10% of a 2.5 s SLO
        ({"queue_mean": 0.2499}, False),
        ({"queue_mean": 4.0, "preemptions": 3}, False),  # memory, not the batch limit
        ({"queue_mean": None}, False),
    ],
)
def test_batch_bound_from_queueing_at_a_tenth_of_the_slo_with_cache_room(
    values: dict[str, float | None], fires: bool
) -> None:
    assert (rules.batch_bound(window(**values), 2.5) is not None) is fires


@pytest.mark.parametrize(
    ("values", "fires"),
    [
        ({"prefill_share": 0.5, "ttft_p90": 2.6}, True),
        ({"prefill_share": 0.4999, "ttft_p90": 2.6}, False),
        ({"prefill_share": 0.9, "ttft_p90": 2.5}, False),  # the SLO met
        ({"prefill_share": None, "ttft_p90": 9.0}, False),
    ],
)
def test_prefill_bound_from_half_the_time_in_prefill_and_a_missed_ttft(
    values: dict[str, float | None], fires: bool
) -> None:
    assert (rules.prefill_bound(window(**values), 2.5) is not None) is fires


@pytest.mark.parametrize(
    ("prompt", "completion", "model_max", "length"),
    [(60, 140, 131072, 512), (256, 256, 131072, 1024), (257, 256, 131072, 2048),
     (30000, 10000, 32768, 32768)],
)  # fmt: skip
def test_max_model_len_is_twice_the_longest_request_as_a_power_of_two(
    prompt: int, completion: int, model_max: int, length: int
) -> None:
    seen = window(prompt_tokens_p99=prompt, generation_tokens_p99=completion)
    assert rules.needed_model_len(seen, model_max) == length
    assert rules.needed_model_len(window(prompt_tokens_p99=None), model_max) is None


def test_refusal_needs_the_minimum_traffic_and_the_load_signals() -> None:
    assert rules.refusal(window(requests=50), 50) is None
    assert "49 finished requests" in (rules.refusal(window(requests=49), 50) or "")
    unexported = rules.refusal(window(("generation_tokens",), generation_tokens=None), 50)
    assert unexported == (
        "vllm does not export inferwatch_engine_request_generation_tokens_sum "
        "(generation_tokens), which advice needs"
    )
    assert "no prompt_tokens" in (rules.refusal(window(prompt_tokens=None), 50) or "")


def _plan(seen: Window, ttft: float = 2.5) -> planning.Plan:
    model, gpu = cap.model_preset(MODEL), cap.gpu_preset("H100")
    return planning.plan(seen, model, gpu, 1, planning.Objectives(ttft))


def test_the_plan_is_the_smallest_batch_that_meets_the_slo_on_the_fewest_gpus() -> None:
    chosen = _plan(window(requests=60 * 30))  # 30 requests/s: tens of sequences at once
    assert chosen.gpus == 1 and "batch_bound" in chosen.findings
    target = sizing.SLO(ttft=2.5 * planning.HEADROOM)
    assert chosen.estimate.meets(target)
    smaller = [s for s in planning.SEQS if s < chosen.capacity.max_num_seqs]
    assert smaller, "the plan took the smallest batch limit: nothing to compare"
    for seqs in smaller:  # every smaller batch limit misses on one replica
        serving = cap.ServingSpec(max_num_seqs=seqs, max_num_batched_tokens=2048,
                                  max_model_len=chosen.capacity.max_model_len)  # fmt: skip
        capacity = cap.size(cap.model_preset(MODEL), cap.gpu_preset("H100"), serving)
        assert not sizing.estimate(capacity, chosen.workload, 1).meets(target)


def test_more_load_than_one_replica_serves_is_more_replicas() -> None:
    chosen = _plan(window(requests=60 * 400))
    assert chosen.estimate.replicas > 1 and chosen.fewer is not None
    assert not chosen.fewer.meets(sizing.SLO(ttft=2.5 * planning.HEADROOM))


def test_memory_pressure_raises_gpu_memory_utilization() -> None:
    assert _plan(window()).capacity.serving.gpu_memory_utilization == 0.92
    pressed = _plan(window(preemptions=5))
    assert pressed.capacity.serving.gpu_memory_utilization == rules.MEMORY_BOUND_UTILIZATION


def test_an_slo_below_the_floor_is_unmeetable() -> None:
    with pytest.raises(planning.Unmeetable, match="single-request floor"):
        _plan(window(), ttft=0.001)


# --- the command against fixed answers ---------------------------------------------------------


@pytest.fixture
def prometheus() -> Iterator[StubPrometheus]:
    with stub_prometheus() as stub:
        yield stub


def run(url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        main, ["advise", "--prometheus", url, "--model", MODEL, "--window", "1m", *args]
    )
    return result.exit_code, result.stdout, result.stderr


def test_json_carries_each_proposal_with_its_flag_evidence_and_effect(
    prometheus: StubPrometheus,
) -> None:
    answering(prometheus, window())
    code, out, err = run(prometheus.url, "--json")
    assert code == ExitCode.OK, err
    advice = json.loads(out)
    proposed = {p["setting"]: p for p in advice["proposals"]}
    assert [proposed[s]["flag"] for s in ("max_num_seqs", "max_num_batched_tokens",
            "gpu_memory_utilization", "max_model_len")] == [
        "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
        "--max-model-len"]  # fmt: skip
    seqs = proposed["max_num_seqs"]
    assert "batch limit" in seqs["finding"] and "sequences each replica decodes" in seqs["effect"]
    queue = next(e for e in seqs["evidence"] if e["signal"] == "queue_mean")
    assert queue["value"] == 4.0
    assert queue["series"] == "inferwatch_engine_request_queue_duration_seconds_sum"
    assert advice["replicas"] == advice["gpus"] == 1 and advice["missing"] == []


def test_the_table_names_a_signal_the_engine_does_not_export(prometheus: StubPrometheus) -> None:
    answering(prometheus, window(("preemptions",), preemptions=None))
    code, out, err = run(prometheus.url)
    assert code == ExitCode.OK, err
    assert "--max-num-seqs" in out
    assert "missing   preemptions: vllm does not export inferwatch_engine_preemptions_total" in out


@pytest.mark.parametrize(
    ("seen", "said"),
    [
        (window(requests=10), r"the last 60 s hold 10 finished requests"),
        (window(("prompt_tokens",), prompt_tokens=None), r"does not export .*prompt_tokens_sum"),
    ],
)
def test_too_little_traffic_or_no_load_signal_is_one_line_and_exit_2(
    prometheus: StubPrometheus, seen: Window, said: str
) -> None:
    answering(prometheus, seen)
    code, out, err = run(prometheus.url)
    assert code == ExitCode.BAD_INPUT and out == ""
    assert len(err.splitlines()) == 1 and re.search(said, err), err


def test_an_unreachable_prometheus_exits_3() -> None:
    with refused_port() as port:
        code, _, err = run(f"http://127.0.0.1:{port}", "--timeout", "5")
    assert code == ExitCode.CANNOT_RUN and err.startswith("Error: ") and len(err.splitlines()) == 1


def test_an_slo_no_setting_meets_exits_1(prometheus: StubPrometheus) -> None:
    answering(prometheus, window())
    code, _, err = run(prometheus.url, "--slo-ttft", "0.001")
    assert code == ExitCode.FAILED and "no setting meets the SLO" in err
