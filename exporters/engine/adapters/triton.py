"""NVIDIA Triton Inference Server, with or without the TensorRT-LLM backend.

Series carry ``model`` and ``version`` (the Triton model and its version), which become our
``model`` and ``model_version``. TensorRT-LLM publishes gauges that hold several quantities
in one family, told apart by a label (``request_type``, ``kv_cache_block_type``): the
catalogue selects them with ``match``. Time to first response is a real histogram, but in
milliseconds and opt-in (``--metrics-config histogram_latencies=true``).

End-to-end and queue time come as sum-and-count histograms in seconds, from whichever form
the server was started with:

- the opt-in summaries ``nv_inference_{request,queue}_summary_us``
  (``--metrics-config summary_latencies=true``): their ``_sum`` and ``_count`` are the
  histogram's sum and count, the same observations. Their quantiles are left out: a
  quantile cannot be turned into buckets, nor added up across replicas (the catalogue's
  histograms can), so ``histogram_quantile`` over these series returns NaN, while mean
  latency works the same as with the other engines.
- the default cumulative microsecond counters without ``_total``
  (``nv_inference_{request,queue}_duration_us``, off with ``counter_latencies=false``), counted
  over successful requests, which is the count Triton's documentation pairs them with.

The summaries come first where both are on: their count is that of the durations summed.
"""

from __future__ import annotations

from inferwatch.catalog import Alias
from inferwatch.exporters.engine.adapters.adapter import Adapter, SumCount, VersionEndpoint

MICROSECOND = 1e-6
_SUCCESSES = Alias("nv_inference_request_success")


def _latency(summary: str, counter: str) -> tuple[SumCount, SumCount]:
    """A summary's sum and count, else the cumulative counter over successful requests."""
    return (
        SumCount(
            sum=(Alias(f"{summary}_sum", scale=MICROSECOND),), count=Alias(f"{summary}_count")
        ),
        SumCount(sum=(Alias(counter, scale=MICROSECOND),), count=_SUCCESSES),
    )


ADAPTER = Adapter(
    name="triton",
    identity_labels={"model": "model", "model_version": "version"},
    derived={
        "engine_request_duration": _latency(
            "nv_inference_request_summary_us", "nv_inference_request_duration_us"
        ),
        "engine_request_queue_duration": _latency(
            "nv_inference_queue_summary_us", "nv_inference_queue_duration_us"
        ),
    },
    version_endpoints=(VersionEndpoint("/v2", {"engine_version": ("version",)}),),
)
