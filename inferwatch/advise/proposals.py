"""Each proposed setting with its evidence (the series and values read) and expected effect.

A proposal names the setting, the engine's flag for it and the value of the plan; its
evidence is the window's readings that bear on it and the rule's finding, if one fired; its
effect is what the capacity model expects at that value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferwatch.advise import flags
from inferwatch.advise.plan import Plan
from inferwatch.advise.window import Window
from inferwatch.capacity import sizing

#: setting -> (the signals shown as its evidence, the rule whose finding is its reason)
EVIDENCE: dict[str, tuple[tuple[str, ...], str | None]] = {
    "max_num_seqs": (("queue_mean", "running_max", "running_mean", "waiting_mean"), "batch_bound"),
    "max_num_batched_tokens": (("prefill_share", "prompt_tokens", "ttft_p90"), "prefill_bound"),
    "gpu_memory_utilization": (
        ("kv_usage_max", "preemptions", "gpu_memory_used_ratio"), "memory_bound"
    ),
    "max_model_len": (("prompt_tokens_p99", "generation_tokens_p99"), None),
    "replicas": (("requests", "replicas", "ttft_p90", "tpot_p90"), None),
}  # fmt: skip


@dataclass(frozen=True)
class Evidence:
    signal: str
    series: str
    expr: str
    value: float | None


@dataclass(frozen=True)
class Proposal:
    setting: str
    flag: str | None  # the engine's flag, None where it has none (replicas: the deployment)
    value: float
    finding: str | None  # the rule's finding, when one fired
    evidence: tuple[Evidence, ...]
    effect: str


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def at(estimate: sizing.Estimate) -> str:
    if estimate.overloaded is not None:
        return f"{estimate.replicas} replicas overloaded: {estimate.overloaded}"
    return (
        f"{estimate.replicas} replica(s): TTFT {_ms(estimate.ttft)}, TPOT {_ms(estimate.tpot)} "
        f"(means), {estimate.running} sequences decoding each"
    )


def _effects(plan: Plan) -> dict[str, str]:
    capacity, load, estimate = plan.capacity, plan.workload, plan.estimate
    chunk = max(1, capacity.max_num_batched_tokens - estimate.running)
    steps = math.ceil(load.prompt_tokens / chunk)
    length = load.prompt_tokens + load.completion_tokens
    fewer = "" if plan.fewer is None else f"; at one fewer, {at(plan.fewer)}"
    return {
        "max_num_seqs": f"admits the {estimate.running} sequences each replica decodes at "
        f"{estimate.rate_per_replica:.3g} requests/s without queueing for a slot",
        "max_num_batched_tokens": f"a {load.prompt_tokens}-token prompt prefills in {steps} "
        f"step(s) beside {estimate.running} decodes",
        "gpu_memory_utilization": f"KV cache of {capacity.num_blocks:,} blocks "
        f"({capacity.kv_tokens:,} tokens): {capacity.max_sequences(length):,} requests of "
        f"{length:,} tokens fit at once",
        "max_model_len": f"starts from gpu-memory-utilization "
        f"{capacity.min_gpu_memory_utilization:.2f}; longer requests are refused",
        "replicas": at(estimate) + fewer,
    }


def proposals(window: Window, plan: Plan) -> list[Proposal]:
    capacity = plan.capacity
    values: dict[str, float] = {
        "max_num_seqs": capacity.max_num_seqs,
        "max_num_batched_tokens": capacity.max_num_batched_tokens,
        "gpu_memory_utilization": capacity.serving.gpu_memory_utilization,
        "max_model_len": capacity.max_model_len,
        "replicas": plan.estimate.replicas,
    }
    effects = _effects(plan)
    made = []
    for setting, value in values.items():
        signals, rule = EVIDENCE[setting]
        evidence = tuple(
            Evidence(signal, reading.series, reading.expr, reading.value)
            for signal in signals
            if (reading := window.readings.get(signal)) is not None
        )
        made.append(
            Proposal(
                setting,
                flags.flag(window.engine, setting),
                value,
                None if rule is None else plan.findings.get(rule),
                evidence,
                effects[setting],
            )
        )
    return made
