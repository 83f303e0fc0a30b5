"""Hugging Face Text Generation Inference (router ``/metrics``).

TGI's Rust exporter writes counters without ``_total`` (typed only by ``# TYPE``) and puts no
label on anything, not even the model: the model comes from the caller's identity, or from
``GET /info``. Token counts exist only as the sums of the per-request length histograms.

Time to first token is not measured by TGI. Its maintainers' answer (TGI#2887, and the
"Time to first token" stat of TGI's own Grafana board) is queue time plus prefill time, and
that is what is derived here, as a histogram with only a ``+Inf`` bucket:

* count = ``tgi_request_queue_duration_count``: requests that left the queue for a batch;
* sum = ``tgi_request_queue_duration_sum`` + ``tgi_batch_inference_duration_sum`` of
  ``method="prefill"``: seconds those requests waited, plus seconds spent in prefill calls.

``rate(sum) / rate(count)`` is then the mean time from entering the queue to the first token
being produced. It approximates the true mean TTFT: it leaves out request validation
(tokenization) and the network, and a prefill call is counted once however many requests it
serves, so with k requests per prefill batch the prefill part is understated k-fold (exact
when each prefill serves one request, the common case at low load). Buckets are not derived:
the distribution of a sum is not determined by its two parts' distributions, and any estimate
that moves with the data would make bucket counters decrease between scrapes, which
Prometheus reads as counter resets. Quantile queries on this series return NaN, which is
honest; mean-based panels and alerts work.

``GET /info`` tells the router's limits: ``max_concurrent_requests`` and ``max_total_tokens``.
"""

from __future__ import annotations

from inferwatch.catalog import Alias
from inferwatch.exporters.engine.adapters.adapter import (
    Adapter,
    JsonField,
    SumCount,
    VersionEndpoint,
)

ADAPTER = Adapter(
    name="tgi",
    derived={
        "engine_time_to_first_token": SumCount(
            sum=(
                Alias("tgi_request_queue_duration_sum"),
                Alias("tgi_batch_inference_duration_sum", match={"method": "prefill"}),
            ),
            count=Alias("tgi_request_queue_duration_count"),
        ),
    },
    version_endpoints=(
        VersionEndpoint("/info", {"engine_version": ("version",), "model": ("model_id",)}),
    ),
    settings={
        "max_num_seqs": (JsonField("/info", ("max_concurrent_requests",)),),
        "max_model_len": (JsonField("/info", ("max_total_tokens",)),),
    },
)
