"""Replicas for a load and an SLO (``inferwatch capacity --rate``), from the steady state of
the simulator's scheduler limits and roofline.

The inverse is checked against the forward estimate (the count it gives meets the SLO, one
fewer does not, and latency only falls as replicas are added), and the forward estimate
against the simulator's own scheduler, block pool and roofline stepping in simulated time.
"""

from __future__ import annotations

import json
import math
import statistics

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.capacity import planner as cap
from inferwatch.capacity import sizing
from inferwatch.capacity.roofline import Roofline
from inferwatch.cli import main
from inferwatch.sim.kvcache import BlockPool
from inferwatch.sim.scheduler import Request, Scheduler

pytestmark = pytest.mark.unit

LLAMA_H100 = cap.compute(cap.model_preset("llama-3.1-8b"), cap.gpu_preset("H100"))


def _fitting(model: str, gpu: str, tp: int) -> cap.Capacity | None:
    serving = cap.ServingSpec(tensor_parallel=tp, max_model_len=8192)
    result = cap.size(cap.model_preset(model), cap.gpu_preset(gpu), serving)
    return result if result.problem is None else None


CONFIGS = [
    c
    for model in cap.MODEL_CONFIGS
    for gpu in cap.GPU_PRESETS
    for tp in (1, 2)
    if (c := _fitting(model, gpu, tp)) is not None
]


def test_there_are_configurations_to_try() -> None:
    assert len(CONFIGS) >= 10


@settings(max_examples=60, deadline=None)  # a busy 2-core machine is slow, not wrong
@given(
    capacity=st.sampled_from(CONFIGS),
    rate=st.floats(min_value=0.05, max_value=400),
    prompt=st.integers(min_value=1, max_value=4000),
    completion=st.integers(min_value=1, max_value=2000),
    ttft_factor=st.one_of(st.none(), st.floats(min_value=1.01, max_value=30)),
    tpot_factor=st.one_of(st.none(), st.floats(min_value=1.01, max_value=30)),
)
def test_the_inverse_is_the_fewest_replicas_the_forward_estimate_accepts(
    capacity: cap.Capacity,
    rate: float,
    prompt: int,
    completion: int,
    ttft_factor: float | None,
    tpot_factor: float | None,
) -> None:
    workload = sizing.Workload(rate, prompt, completion)
    best = sizing.floors(capacity, workload)
    slo = sizing.SLO(
        ttft=None if ttft_factor is None else best.ttft * ttft_factor,
        tpot=None if tpot_factor is None else best.tpot * tpot_factor,
    )
    needed = sizing.replicas_for(capacity, workload, slo)
    assert sizing.estimate(capacity, workload, needed.replicas).meets(slo)
    if needed.replicas > 1:
        assert not sizing.estimate(capacity, workload, needed.replicas - 1).meets(slo)
    # more replicas never make it worse, so no larger count is wrongly skipped
    more = sizing.estimate(capacity, workload, needed.replicas + 1)
    assert more.meets(slo)
    assert more.tpot <= needed.tpot * (1 + 1e-9) and more.ttft <= needed.ttft * (1 + 1e-9)
    # and nothing beats the floors
    assert needed.tpot >= best.tpot and needed.ttft >= best.ttft


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.sampled_from(CONFIGS),
    rate=st.floats(min_value=0.05, max_value=400),
    counts=st.tuples(st.integers(1, 64), st.integers(1, 64)).map(sorted),
)
def test_latency_only_falls_as_replicas_are_added(
    capacity: cap.Capacity, rate: float, counts: list[int]
) -> None:
    workload = sizing.Workload(rate, 700, 150)
    fewer, more = (sizing.estimate(capacity, workload, n) for n in counts)
    if fewer.overloaded is None:
        assert more.overloaded is None
    assert more.tpot <= fewer.tpot * (1 + 1e-9)
    assert more.ttft <= fewer.ttft * (1 + 1e-9)


@pytest.mark.parametrize("signal", ["ttft", "tpot"])
def test_an_slo_at_or_below_the_single_request_floor_says_so_with_the_floor(signal: str) -> None:
    workload = sizing.Workload(50, 512, 128)
    floor = getattr(sizing.floors(LLAMA_H100, workload), signal)
    for objective in (floor, floor * 0.5):
        with pytest.raises(cap.CapacityError) as caught:
            sizing.replicas_for(LLAMA_H100, workload, sizing.SLO(**{signal: objective}))
        message = str(caught.value)
        assert f"{signal.upper()} SLO" in message and "single-request floor" in message
        assert f"{floor * 1000:.4g} ms" in message
    # just above the floor is reachable, with more replicas the closer it is
    near = sizing.replicas_for(LLAMA_H100, workload, sizing.SLO(**{signal: floor * 1.02}))
    far = sizing.replicas_for(LLAMA_H100, workload, sizing.SLO(**{signal: floor * 1.5}))
    assert near.replicas >= far.replicas >= 1


def test_the_tpot_floor_is_one_request_decoding_alone() -> None:
    workload = sizing.Workload(10, 512, 128)
    alone = Roofline(LLAMA_H100).step([(1, 512 + 64)]).seconds
    assert sizing.floors(LLAMA_H100, workload).tpot == alone


def test_one_replica_that_cannot_hold_the_load_is_overloaded_with_the_reason() -> None:
    kv = sizing.estimate(LLAMA_H100, sizing.Workload(100, 512, 128), 1)
    assert kv.overloaded is not None and "the KV cache holds" in kv.overloaded
    assert math.isinf(kv.tpot) and not kv.meets(sizing.SLO())


def test_a_request_longer_than_the_model_allows_is_refused() -> None:
    serving = cap.ServingSpec(max_model_len=4096)
    short = cap.compute(cap.model_preset("llama-3.1-8b"), cap.gpu_preset("H100"), serving)
    with pytest.raises(cap.CapacityError, match="longer than max-model-len 4096"):
        sizing.estimate(short, sizing.Workload(1, 4000, 200), 1)


# --- against the simulator's scheduler ----------------------------------------------------------
def simulate(capacity: cap.Capacity, rate: float, prompt: int, completion: int, n: int = 400):
    """Mean TTFT and TPOT of the second half of ``n`` requests arriving every 1/rate s,
    stepped by the simulator's scheduler and roofline in simulated time (what Engine.run
    does, without the wall clock)."""
    pool = BlockPool(capacity.num_blocks, capacity.block_size, enable_prefix_caching=False)
    scheduler = Scheduler(pool, capacity.max_num_seqs, capacity.max_num_batched_tokens)
    roofline = Roofline(capacity)
    arrivals = [i / rate for i in range(n)]
    now, admitted = 0.0, 0
    ttft: list[float] = []
    gaps: list[float] = []
    last: dict[str, float] = {}
    while admitted < n or scheduler.has_work:
        while admitted < n and arrivals[admitted] <= now:
            i = admitted
            scheduler.add(Request(id=str(i), prompt=[f"{i}-{k}" for k in range(prompt)],
                                  planned=["x"] * completion, finish_reason="length",
                                  max_tokens=completion, arrival=arrivals[i]))  # fmt: skip
            admitted += 1
        if not scheduler.has_work:
            now = arrivals[admitted]
            continue
        plan = scheduler.schedule()
        assert plan.scheduled, "blocked on KV blocks"
        now += roofline.step([(s.new_tokens, s.context) for s in plan.scheduled]).seconds
        for emitted in scheduler.complete(plan):
            request = emitted.request
            late = request.arrival >= arrivals[n // 2]
            if emitted.first and late:
                ttft.append(now - request.arrival)
            elif late:
                gaps.append(now - last[request.id])
            last[request.id] = now
    return statistics.mean(ttft), statistics.mean(gaps)


@pytest.mark.parametrize(
    ("rate", "prompt", "completion"),
    [(10, 512, 128), (25, 512, 128), (40, 256, 64), (5, 2000, 300)],
)
def test_the_estimate_agrees_with_the_simulated_scheduler(
    rate: float, prompt: int, completion: int
) -> None:
    measured_ttft, measured_tpot = simulate(LLAMA_H100, rate, prompt, completion)
    estimate = sizing.estimate(LLAMA_H100, sizing.Workload(rate, prompt, completion), 1)
    assert estimate.tpot == pytest.approx(measured_tpot, rel=0.1)
    assert estimate.ttft == pytest.approx(measured_ttft, rel=0.1)


def test_the_sized_fleet_meets_the_slo_in_the_simulator_and_one_fewer_does_not() -> None:
    workload = sizing.Workload(120, 512, 128)
    slo = sizing.SLO(tpot=0.0105)
    needed = sizing.replicas_for(LLAMA_H100, workload, slo)
    assert needed.replicas >= 2
    _, at_needed = simulate(LLAMA_H100, workload.rate / needed.replicas, 512, 128)
    _, at_fewer = simulate(LLAMA_H100, workload.rate / (needed.replicas - 1), 512, 128)
    assert at_needed <= 0.0105 < at_fewer


# --- the CLI ------------------------------------------------------------------------------------
SIZE = ["capacity", "--max-model-len", "8192", "--rate", "100", "--prompt-tokens", "512",
        "--completion-tokens", "128"]  # fmt: skip


def test_cli_prints_the_replicas_and_the_estimate_there_and_at_one_fewer() -> None:
    result = CliRunner().invoke(main, [*SIZE, "--ttft-slo", "0.2", "--tpot-slo", "0.02"])
    assert result.exit_code == 0, result.output
    capacity = cap.compute(cap.model_preset("llama-3.1-8b"), cap.gpu_preset("H100"),
                           cap.ServingSpec(max_model_len=8192))  # fmt: skip
    needed = sizing.replicas_for(
        capacity, sizing.Workload(100, 512, 128), sizing.SLO(ttft=0.2, tpot=0.02)
    )
    assert result.output.count(f"replicas needed  {needed.replicas}\n") == 1
    assert f"at {needed.replicas - 1} " in result.output and "misses the" in result.output
    # the memory table comes first
    assert result.output.index("KV blocks") < result.output.index("replicas needed")


def test_cli_json_has_the_sizing() -> None:
    result = CliRunner().invoke(main, [*SIZE, "--tpot-slo", "0.02", "--json"])
    assert result.exit_code == 0, result.output
    sized = json.loads(result.output)["sizing"]
    assert sized["replicas"] == sized["at_replicas"]["replicas"]
    assert sized["at_replicas"]["tpot_seconds"] <= 0.02
    fewer = sized["at_one_fewer"]
    assert fewer is None or fewer["overloaded"] or fewer["tpot_seconds"] > 0.02
    assert sized["floor_tpot_seconds"] <= sized["at_replicas"]["tpot_seconds"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*SIZE, "--tpot-slo", "0.001"], "TPOT SLO 1 ms is not above the single-request floor"),
        ([*SIZE, "--ttft-slo", "0.001"], "TTFT SLO 1 ms is not above the single-request floor"),
        (["capacity", "--tpot-slo", "0.05"], "--tpot-slo sizes replicas for a load"),
        (["capacity", "--rate", "3"], "--rate needs --prompt-tokens and --completion-tokens"),
        (["capacity", "--max-model-len", "1000", "--rate", "3", "--prompt-tokens", "900",
          "--completion-tokens", "200"], "longer than max-model-len 1000"),
    ],
)  # fmt: skip
def test_cli_sizing_errors_are_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert result.output.startswith("Error: ") and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(min_value=0, max_value=1e12),
    prompt=st.integers(min_value=1, max_value=10**7),
    completion=st.integers(min_value=1, max_value=10**7),
    ttft=st.one_of(st.none(), st.floats(min_value=1e-6, max_value=1e6)),
    tpot=st.one_of(st.none(), st.floats(min_value=1e-6, max_value=1e6)),
)
def test_any_sizing_flags_give_an_answer_or_one_line(
    rate: float, prompt: int, completion: int, ttft: float | None, tpot: float | None
) -> None:
    args = ["capacity", "--max-model-len", "32768", "--rate", repr(rate),
            "--prompt-tokens", str(prompt), "--completion-tokens", str(completion)]  # fmt: skip
    for flag, value in (("--ttft-slo", ttft), ("--tpot-slo", tpot)):
        if value is not None:
            args += [flag, repr(value)]
    result = CliRunner().invoke(main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    if result.exit_code == 0:
        assert "replicas needed" in result.output
    else:
        assert result.exit_code == 2
        assert result.output.startswith("Error: ")
        assert len(result.output.strip().splitlines()) == 1
