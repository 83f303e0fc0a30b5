"""Steady-state latency of replicas under a request rate, and its inverse: replicas for an SLO.

The simulator's own pieces give the answer: the capacity model's limits (KV blocks,
``max_num_seqs``, ``max_num_batched_tokens``) and the roofline's step time. In steady state a
replica taking ``r`` requests a second of ``P`` prompt and ``C`` completion tokens runs, per
step of ``T`` seconds,

* ``ceil(r x C x T)`` sequences decoding (Little's law: each decodes for C steps; at least
  one, the request being priced), and
* ``r x P x T`` prompt tokens of prefill on average, arriving as whole prompts (chunks of what
  the token budget leaves beside the decodes), so a share of the steps carries one more
  chunk than the rest,

and ``T`` is the roofline's mean cost of those steps: a fixed point, found by iterating from
the single-request step. The map only grows, so the iteration climbs to the least fixed point,
or past a limit when the replica cannot keep up. Then

* TPOT = T (every running sequence gets one token per step), and
* TTFT = T/2 (the step in progress) + the steps of the request's own prefill beside the
  decodes (vLLM V1 schedules running requests first).

The floors are the estimate at rate 0: one request alone decoding, and a prompt that waits
for half a step. Latency only grows with the rate per replica, so the fewest replicas that
meet an SLO is found by doubling, then bisection. Against the simulator's scheduler run on
the same roofline (tests/test_sizing.py), TPOT agrees within a few percent until a replica
nears saturation, where the estimate runs high, as TTFT does at low load (the simulated
engine is often idle when a request arrives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferwatch.capacity.planner import Capacity, CapacityError
from inferwatch.capacity.roofline import Roofline

#: the largest fleet rate sized, requests/s (far beyond any fleet; keeps the arithmetic finite)
MAX_RATE = 1e9
#: bound on the fixed-point iteration; each round adds at least one sequence or token, so a
#: replica's limits (at most a few thousand of each) end it long before
MAX_ROUNDS = 100_000
#: replica counts tried are 1, 2, 4, ... up to 2**MAX_DOUBLINGS before giving up
MAX_DOUBLINGS = 40
#: the iteration has settled when a round lengthens the step by less than this share
SETTLED = 1e-9


@dataclass(frozen=True)
class Workload:
    rate: float  # requests per second, the whole fleet
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class SLO:
    """Mean TTFT and TPOT in seconds; None: no objective."""

    ttft: float | None = None
    tpot: float | None = None


@dataclass(frozen=True)
class Estimate:
    replicas: int
    rate_per_replica: float
    running: int  # sequences decoding in each step
    prefill_tokens: float  # prompt tokens prefilled in a step, on average
    tpot: float  # seconds; inf when overloaded
    ttft: float
    overloaded: str | None  # why a replica cannot keep up, or None

    def meets(self, slo: SLO) -> bool:
        if self.overloaded is not None:
            return False
        return (slo.ttft is None or self.ttft <= slo.ttft) and (
            slo.tpot is None or self.tpot <= slo.tpot
        )


def check(capacity: Capacity, workload: Workload) -> None:
    """Raise CapacityError for a workload no replica of this configuration can serve."""
    if not 0 <= workload.rate <= MAX_RATE:
        raise CapacityError(
            f"the request rate must be between 0 and {MAX_RATE:g} requests/s, not {workload.rate}"
        )
    if workload.prompt_tokens < 1 or workload.completion_tokens < 1:
        raise CapacityError("prompt and completion lengths are at least 1 token each")
    length = workload.prompt_tokens + workload.completion_tokens
    if length > capacity.max_model_len:
        raise CapacityError(
            f"a request of {workload.prompt_tokens} + {workload.completion_tokens} tokens is "
            f"longer than max-model-len {capacity.max_model_len}"
        )


def estimate(capacity: Capacity, workload: Workload, replicas: int) -> Estimate:
    """Steady-state TTFT and TPOT with the fleet's rate spread evenly over ``replicas``."""
    check(capacity, workload)
    if replicas < 1:
        raise CapacityError("the replica count is at least 1")
    rate = workload.rate / replicas
    prompt, completion = workload.prompt_tokens, workload.completion_tokens
    roofline = Roofline(capacity)
    context = prompt + completion // 2  # the mean context a decoding sequence attends over
    slots = min(capacity.max_num_seqs, capacity.max_sequences(prompt + completion))
    budget = capacity.max_num_batched_tokens

    def step(running: int, prefill: float) -> float:
        """The mean step: prompts arrive whole (in chunks of what the budget leaves), so
        a share of the steps carries one more chunk than the rest."""
        size = max(1, min(prompt, budget - running))
        chunks = prefill / size
        fewer, share = math.floor(chunks), chunks - math.floor(chunks)
        decodes = [(1, context)] * running
        cost = roofline.step(decodes + [(size, prompt)] * fewer).seconds
        if share:
            more = roofline.step(decodes + [(size, prompt)] * (fewer + 1)).seconds
            cost += share * (more - cost)
        return cost

    def overloaded(running: int, prefill: float, why: str) -> Estimate:
        return Estimate(replicas, rate, running, prefill, math.inf, math.inf, why)

    seconds, running, prefill = step(1, 0), 1, 0.0
    for _ in range(MAX_ROUNDS):
        running = max(1, math.ceil(rate * completion * seconds))
        prefill = rate * prompt * seconds
        if running > slots:
            limit = "max-num-seqs" if slots == capacity.max_num_seqs else "the KV cache"
            why = f"{running} sequences at once; {limit} holds {slots}"
            return overloaded(running, prefill, why)
        if running + prefill > budget:
            return overloaded(
                running, prefill, f"{math.ceil(running + prefill)} tokens a step; "
                f"max-num-batched-tokens is {budget}",
            )
        seconds, before = step(running, prefill), seconds
        if seconds - before <= SETTLED * before:
            break
    else:
        return overloaded(running, prefill, "its queue does not settle at this rate")
    ttft = seconds / 2
    chunk, done = max(1, budget - running), 0
    while done < prompt:
        size = min(chunk, prompt - done)
        done += size
        ttft += roofline.step([(1, context)] * running + [(size, done)]).seconds
    return Estimate(replicas, rate, running, prefill, seconds, ttft, None)


def floors(capacity: Capacity, workload: Workload) -> Estimate:
    """The best TTFT and TPOT any number of replicas gives (the lightly loaded replica)."""
    return estimate(capacity, Workload(0.0, workload.prompt_tokens, workload.completion_tokens), 1)


def replicas_for(capacity: Capacity, workload: Workload, slo: SLO) -> Estimate:
    """The fewest replicas whose estimate meets ``slo`` (and keeps up with the rate).

    Raises CapacityError, naming the floor, when an objective is below what a lightly
    loaded replica achieves, since then no count meets it.
    """
    best = floors(capacity, workload)
    where = (
        f"{capacity.model.name} on {capacity.gpu.name} x{capacity.serving.tensor_parallel} "
        f"({workload.prompt_tokens}-token prompts, {workload.completion_tokens}-token completions)"
    )
    for name, objective, floor in (("TTFT", slo.ttft, best.ttft), ("TPOT", slo.tpot, best.tpot)):
        if objective is not None and objective <= floor:
            raise CapacityError(
                f"the {name} SLO {objective * 1000:.4g} ms is not above the single-request floor "
                f"{floor * 1000:.4g} ms of {where}: no number of replicas meets it"
            )
    high = 1  # the fewest replicas known to meet it, once found
    for _ in range(MAX_DOUBLINGS):
        if estimate(capacity, workload, high).meets(slo):
            break
        high *= 2
    else:
        raise CapacityError(
            f"{where} needs more than {high // 2:,} replicas for this SLO at "
            f"{workload.rate:g} requests/s; it is too close to the single-request floor"
        )
    low = high // 2 if high > 1 else 0  # fails (or 0): high was the first count that met
    while high - low > 1:
        middle = (low + high) // 2
        if estimate(capacity, workload, middle).meets(slo):
            high = middle
        else:
            low = middle
    return estimate(capacity, workload, high)
