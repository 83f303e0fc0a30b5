"""The last window of one model's canonical series, read from Prometheus.

Each signal is one instant query over ``inferwatch_*`` series (``docs/metrics.md``), summed
over the model's replicas; every value keeps the expression that produced it, so that a
proposal can show its evidence. A signal with no sample is None: either the window held no
such event, or the engine does not export it, which :func:`missing` tells apart by asking
whether the series exists at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import itemgetter

from inferwatch import catalog
from inferwatch.canary.prometheus import Prometheus, count
from inferwatch.config import Duration

#: the signals a proposal cannot be made without (the load itself)
REQUIRED = ("requests", "prompt_tokens", "generation_tokens")


@dataclass(frozen=True)
class Reading:
    """One signal: its value (None: no sample), the PromQL read and the series it reads."""

    value: float | None
    expr: str
    series: str


@dataclass(frozen=True)
class Window:
    model: str
    seconds: float
    engine: str  # the engine label of the model's replicas ("" when none reported)
    gpu_name: str  # the GPU product name of its replicas ("" when none reported)
    readings: dict[str, Reading] = field(default_factory=dict)
    #: signals whose series the engine does not export at all
    unexported: tuple[str, ...] = ()

    def value(self, signal: str) -> float | None:
        reading = self.readings.get(signal)
        return None if reading is None else reading.value

    @property
    def requests(self) -> int:
        return count(self.value("requests"))

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def _name(key: str) -> str:
    return catalog.load()[key].name


def _selector(model: str) -> str:
    return '{model="' + model.replace("\\", "\\\\").replace('"', '\\"') + '"}'


def queries(model: str, window: Duration) -> dict[str, tuple[str, str, str]]:
    """signal -> (PromQL, the catalogue series it reads, a selection of that series for the
    model), for ``model`` over ``window``. GPU series carry no model label: they are the
    ones scraped from the same sidecar (``instance``) as the model's engine series."""
    sel = _selector(model)
    w = str(window)
    of_model = f"and on (instance) {_name('engine_up')}{sel}"

    def quantile(q: float, key: str) -> tuple[str, str, str]:
        bucket = f"{_name(key)}_bucket"
        expr = f"histogram_quantile({q}, sum by (le) (rate({bucket}{sel}[{w}])))"
        return expr, bucket, f"{bucket}{sel}"

    def mean(key: str) -> tuple[str, str, str]:
        name = _name(key)
        expr = f"sum(rate({name}_sum{sel}[{w}])) / sum(rate({name}_count{sel}[{w}]))"
        return expr, f"{name}_sum", f"{name}_sum{sel}"

    def over_time(how: str, key: str, across: str = "max") -> tuple[str, str, str]:
        name = _name(key)
        return f"{across}({how}_over_time({name}{sel}[{w}]))", name, f"{name}{sel}"

    def increase(key: str) -> tuple[str, str, str]:
        name = _name(key)
        return f"sum(increase({name}{sel}[{w}]))", name, f"{name}{sel}"

    prefill = _name("engine_request_prefill_duration")
    decode = _name("engine_request_decode_duration")
    used, total = _name("gpu_memory_used"), _name("gpu_memory_total")
    up = _name("engine_up")
    return {
        "requests": increase("engine_requests_finished"),
        "replicas": (f"count(max by (pod) (max_over_time({up}{sel}[{w}])) == 1)", up,
                     f"{up}{sel}"),
        "prompt_tokens": mean("engine_request_prompt_tokens"),
        "generation_tokens": mean("engine_request_generation_tokens"),
        "prompt_tokens_p99": quantile(0.99, "engine_request_prompt_tokens"),
        "generation_tokens_p99": quantile(0.99, "engine_request_generation_tokens"),
        "queue_mean": mean("engine_request_queue_duration"),
        "ttft_p50": quantile(0.5, "engine_time_to_first_token"),
        "ttft_p90": quantile(0.9, "engine_time_to_first_token"),
        "ttft_p99": quantile(0.99, "engine_time_to_first_token"),
        "tpot_p90": quantile(0.9, "engine_time_per_output_token"),
        "tpot_p99": quantile(0.99, "engine_time_per_output_token"),
        "running_max": over_time("max", "engine_requests_running"),
        "running_mean": over_time("avg", "engine_requests_running", "sum"),
        "waiting_mean": over_time("avg", "engine_requests_waiting", "sum"),
        "kv_usage_max": over_time("max", "engine_kv_cache_usage"),
        "preemptions": increase("engine_preemptions"),
        "prefill_share": (
            f"sum(rate({prefill}_sum{sel}[{w}])) / (sum(rate({prefill}_sum{sel}[{w}])) + "
            f"sum(rate({decode}_sum{sel}[{w}])))",
            f"{prefill}_sum",
            f"{prefill}_sum{sel}",
        ),
        "gpu_memory_used_ratio": (
            f"max(max_over_time({used}[{w}]) {of_model}) / max({total} {of_model})",
            used,
            f"{used} {of_model}",
        ),
    }  # fmt: skip


def read(prometheus: Prometheus, model: str, window: Duration, at: float) -> Window:
    """Every signal of ``model`` over the ``window`` that ends at ``at`` (unix seconds)."""
    readings: dict[str, Reading] = {}
    unexported = []
    w = str(window)
    for signal, (expr, series, present) in queries(model, window).items():
        value = prometheus.scalar(expr, at)
        if value is not None and not math.isfinite(value):
            value = None  # a quantile of no observations, a ratio of nothing
        readings[signal] = Reading(value, expr, series)
        if value is None and not prometheus.query(f"count(last_over_time(({present})[{w}:]))", at):
            unexported.append(signal)
    sel = _selector(model)
    of_model = f"and on (instance) {_name('engine_up')}{sel}"
    engine = _label(
        prometheus,
        f"count by (engine) (last_over_time({_name('engine_up')}{sel}[{w}]))",
        "engine",
        at,
    )
    gpu = _label(prometheus, f"count by (name) ({_name('gpu_info')} {of_model})", "name", at)
    return Window(model, window.seconds, engine, gpu, readings, tuple(unexported))


def _label(prometheus: Prometheus, expr: str, label: str, at: float) -> str:
    """The most common value of ``label`` among the series ``expr`` counts ("" when none)."""
    samples = prometheus.query(expr, at)
    return max(samples, key=itemgetter(1))[0].get(label, "") if samples else ""
