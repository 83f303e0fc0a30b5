"""Windows of fixed readings for ``inferwatch advise``'s rules and plan: a batch-bound
replica's last minute, with any signal changed or left unexported."""

from __future__ import annotations

from inferwatch.advise.window import Reading, Window, queries
from inferwatch.config import Duration
from support.stub_prometheus import StubPrometheus, vector

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
H100 = "NVIDIA H100 80GB HBM3"
#: a batch-bound replica: 240 requests in 60 s, queueing with a nearly empty KV cache
BUSY: dict[str, float] = {
    "requests": 240,
    "replicas": 1,
    "prompt_tokens": 40,
    "generation_tokens": 120,
    "prompt_tokens_p99": 60,
    "generation_tokens_p99": 140,
    "queue_mean": 4.0,
    "ttft_p90": 4.2,
    "running_max": 2,
    "kv_usage_max": 0.05,
    "preemptions": 0,
    "prefill_share": 0.05,
}


def window(unexported: tuple[str, ...] = (), **values: float | None) -> Window:
    """:data:`BUSY` with ``values`` changed (None: no sample), vLLM on an H100."""
    signals = {**BUSY, **values}
    readings = {
        signal: Reading(signals.get(signal), expr, series)
        for signal, (expr, series, _) in queries(MODEL, Duration.of_seconds(60)).items()
    }
    return Window(MODEL, 60.0, "vllm", H100, readings, unexported)


def answering(prometheus: StubPrometheus, seen: Window) -> None:
    """Answer each of advise's queries with ``seen``'s value; a series exists unless it is
    one of ``seen.unexported``; the replicas run vLLM on an H100."""
    values = {reading.expr: reading.value for reading in seen.readings.values()}

    def answer(path: str, query: str) -> tuple[int, bytes]:
        if query in values:
            value = values[query]
            return 200, vector() if value is None else vector(({}, str(value)))
        if query.startswith("count(last_over_time(("):
            missing = any(seen.readings[s].series in query for s in seen.unexported)
            return 200, vector() if missing else vector(({}, "1"))
        if query.startswith("count by (engine)"):
            return 200, vector(({"engine": "vllm"}, "1"))
        if query.startswith("count by (name)"):
            return 200, vector(({"name": H100}, "1"))
        return 400, b'{"status": "error", "error": "unexpected query"}'

    prometheus.answer = answer
