"""The proposal rules: what the window says holds a model's requests back.

Each rule reads a few signals of a :class:`~inferwatch.advise.window.Window` and returns the
finding as one sentence, or None when the window does not show it (or lacks a signal it
reads). The values they lead to come from the capacity model (:mod:`inferwatch.advise.plan`),
never from these thresholds.
"""

from __future__ import annotations

import math

from inferwatch.advise.window import REQUIRED, Window

#: mean queue time at or above this share of the TTFT SLO is waiting worth acting on (the
#: mean, not a quantile: a quantile interpolated inside the histogram's first bucket reads
#: most of that bucket's bound when nothing waited at all)
QUEUE_SHARE = 0.1
#: KV-cache usage at or above which the cache, not the batch limit, is what is full
KV_FULL = 0.9
#: share of the engine's request time spent in prefill at or above which prefill dominates
PREFILL_SHARE = 0.5
#: gpu-memory-utilization proposed when memory is what is short (vLLM's range is (0, 1])
MEMORY_BOUND_UTILIZATION = 0.95
#: max-model-len proposed is this many times the longest request seen (p99), rounded up
LENGTH_HEADROOM = 2


def memory_bound(window: Window) -> str | None:
    """Preemptions, or a KV cache at ``KV_FULL`` or more: the cache holds requests back."""
    preempted = window.value("preemptions")
    usage = window.value("kv_usage_max")
    if preempted is not None and preempted >= 1:
        return f"{preempted:.0f} preemptions in the window: the KV cache ran out"
    if usage is not None and usage >= KV_FULL:
        return f"KV cache {usage:.0%} full at its peak (>= {KV_FULL:.0%})"
    return None


def batch_bound(window: Window, ttft_slo: float) -> str | None:
    """Requests queue (a mean of ``QUEUE_SHARE`` of the TTFT SLO or more) while memory is not
    short: the batch limit (max-num-seqs) is what holds them back."""
    queue = window.value("queue_mean")
    if queue is None or queue < QUEUE_SHARE * ttft_slo or memory_bound(window) is not None:
        return None
    running = window.value("running_max")
    peak = "" if running is None else f", at most {running:.0f} running"
    return (
        f"mean queue time {queue:.3g} s (>= {QUEUE_SHARE:.0%} of the {ttft_slo:g} s TTFT SLO) "
        f"with KV cache room{peak}: the batch limit holds requests back"
    )


def prefill_bound(window: Window, ttft_slo: float) -> str | None:
    """TTFT misses while prefill takes ``PREFILL_SHARE`` or more of the engine's time: the
    prefill token budget (max-num-batched-tokens) is what delays first tokens."""
    share = window.value("prefill_share")
    ttft = window.value("ttft_p90")
    if share is None or ttft is None or share < PREFILL_SHARE or ttft <= ttft_slo:
        return None
    return (
        f"TTFT p90 {ttft:.3g} s over the {ttft_slo:g} s SLO with {share:.0%} of request time "
        f"in prefill: the per-step token budget delays first tokens"
    )


def needed_model_len(window: Window, model_max: int) -> int | None:
    """The max-model-len the window's longest requests (p99 prompt + completion) need, with
    ``LENGTH_HEADROOM``, as a power of two no longer than the model's; None without data."""
    prompt, completion = window.value("prompt_tokens_p99"), window.value("generation_tokens_p99")
    if prompt is None or completion is None:
        return None
    longest = max(1, math.ceil(LENGTH_HEADROOM * (prompt + completion)))
    return min(model_max, 1 << (longest - 1).bit_length())


#: requests a window must hold before advice is given, by default (``--min-requests``)
MIN_REQUESTS = 50


def refusal(window: Window, min_requests: int = MIN_REQUESTS) -> str | None:
    """Why no advice can be given from ``window`` (one line), or None: a signal the load is
    measured by that the engine does not export, or too little traffic."""
    engine = window.engine or "the engine"
    for signal in REQUIRED:
        if signal in window.unexported:
            series = window.readings[signal].series
            return f"{engine} does not export {series} ({signal}), which advice needs"
    if window.requests < min_requests:
        return (
            f"the last {window.seconds:g} s hold {window.requests} finished requests of "
            f"{window.model}; advice needs at least {min_requests} (--min-requests)"
        )
    missing = [signal for signal in REQUIRED if window.value(signal) is None]
    if missing:
        return f"the window has no {', '.join(missing)} for {window.model}"
    return None
