"""The settings and replica count that meet the SLO with the fewest GPUs, by the capacity model.

The window gives the load (request rate, mean prompt and completion lengths); the rules say
which limit holds requests back. For each candidate pair of batch limits the capacity model
(:mod:`inferwatch.capacity.planner`, :mod:`inferwatch.capacity.sizing`) sizes the replica
and the fewest replicas that meet the SLO; the plan is the one with the fewest GPUs, then the
smallest limits (a smaller activation reserve leaves more KV cache). The model's estimates are
steady-state means, so they are held to ``headroom`` times each objective, which leaves the
tail (a p90 or p99 SLO) room.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferwatch.advise import rules
from inferwatch.advise.window import Window
from inferwatch.capacity import planner as cap
from inferwatch.capacity import sizing

#: max-num-seqs values tried (vLLM's default is among them)
SEQS = (8, 16, 32, 64, 128, 256, 512, 1024)
#: max-num-batched-tokens values tried
TOKENS = (2048, 4096, 8192, 16384)
#: the share of each objective the capacity model's mean must stay under, by default
HEADROOM = 0.5


class Unmeetable(ValueError):
    """No candidate meets the SLO; the message says why (the floor, or the load)."""


@dataclass(frozen=True)
class Objectives:
    ttft: float
    tpot: float | None = None


@dataclass(frozen=True)
class Plan:
    capacity: cap.Capacity
    workload: sizing.Workload
    estimate: sizing.Estimate  # at the proposed replica count
    fewer: sizing.Estimate | None  # at one replica fewer, when there is one
    findings: dict[str, str]  # rule -> finding

    @property
    def gpus(self) -> int:
        return self.estimate.replicas * self.capacity.serving.tensor_parallel


def workload(window: Window) -> sizing.Workload:
    prompt, completion = window.value("prompt_tokens"), window.value("generation_tokens")
    assert prompt is not None and completion is not None, "checked by the caller"
    return sizing.Workload(window.rate, max(1, round(prompt)), max(1, round(completion)))


def findings(window: Window, slo: Objectives) -> dict[str, str]:
    found = {
        "memory_bound": rules.memory_bound(window),
        "batch_bound": rules.batch_bound(window, slo.ttft),
        "prefill_bound": rules.prefill_bound(window, slo.ttft),
    }
    return {name: text for name, text in found.items() if text is not None}


def plan(
    window: Window,
    model: cap.ModelSpec,
    gpu: cap.GPUSpec,
    tensor_parallel: int,
    slo: Objectives,
    headroom: float = HEADROOM,
) -> Plan:
    """The cheapest candidate that meets ``slo``; Unmeetable when none does."""
    load = workload(window)
    found = findings(window, slo)
    base = cap.ServingSpec(
        tensor_parallel=tensor_parallel,
        gpu_memory_utilization=(
            rules.MEMORY_BOUND_UTILIZATION if "memory_bound" in found
            else cap.ServingSpec.gpu_memory_utilization
        ),
        max_model_len=rules.needed_model_len(window, model.max_position_embeddings),
    )  # fmt: skip
    target = sizing.SLO(
        ttft=slo.ttft * headroom, tpot=None if slo.tpot is None else slo.tpot * headroom
    )
    best: tuple[tuple[int, int, int], cap.Capacity, sizing.Estimate] | None = None
    reason = "no candidate setting fits the GPU"
    for seqs in SEQS:
        for tokens in TOKENS:
            serving = replace(base, max_num_seqs=seqs, max_num_batched_tokens=tokens)
            capacity = cap.size(model, gpu, serving)
            if capacity.problem is not None:
                reason = capacity.problem
                continue
            try:
                estimate = sizing.replicas_for(capacity, load, target)
            except cap.CapacityError as exc:
                reason = str(exc)
                continue
            key = (estimate.replicas, seqs, tokens)
            if best is None or key < best[0]:
                best = key, capacity, estimate
    if best is None:
        raise Unmeetable(reason)
    _, capacity, estimate = best
    fewer = None
    if estimate.replicas > 1:
        fewer = sizing.estimate(capacity, load, estimate.replicas - 1)
    return Plan(capacity, load, estimate, fewer, found)
