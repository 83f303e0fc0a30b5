"""NVIDIA Triton Inference Server, with or without the TensorRT-LLM backend.

Series carry ``model`` and ``version`` (the Triton model and its version). TensorRT-LLM
publishes gauges that hold several quantities in one family, told apart by a label
(``request_type``, ``kv_cache_block_type``): the catalogue selects them with ``match``.
Triton core latencies are cumulative microsecond counters without ``_total``; end-to-end and
queue time are derived from them as sum-and-count histograms in seconds, counted over
successful requests, which is the count Triton's own documentation pairs them with (the
opt-in ``*_summary_us`` families have matching ``_count`` and ``_sum``). Time to first
response is a real histogram, but in milliseconds and opt-in (``histogram_latencies=true``).
"""

from __future__ import annotations

from inferwatch.catalog import Alias
from inferwatch.exporters.engines.mapping import Adapter, SumCount, VersionEndpoint

MICROSECOND = 1e-6
_SUCCESSES = Alias("nv_inference_request_success")

ADAPTER = Adapter(
    name="triton",
    identity_labels={"model": "model", "model_version": "version"},
    derived={
        "engine_request_duration": SumCount(
            sum=(Alias("nv_inference_request_duration_us", scale=MICROSECOND),),
            count=_SUCCESSES,
        ),
        "engine_request_queue_duration": SumCount(
            sum=(Alias("nv_inference_queue_duration_us", scale=MICROSECOND),),
            count=_SUCCESSES,
        ),
    },
    version_endpoints=(VersionEndpoint("/v2", {"engine_version": ("version",)}),),
)
