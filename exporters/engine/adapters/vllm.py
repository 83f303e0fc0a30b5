"""vLLM: the V1 engine, and the V0-era names still running in the field.

Every engine series carries ``model_name`` and ``engine``, the index of the EngineCore that
produced it; under data parallelism one endpoint shows one series per rank. Consumers that
keep "the last sample" silently drop ranks, so the mapping sums counters, gauges and
histogram buckets over ``engine`` and takes the fullest rank's KV-cache usage. Names renamed
between releases (``gpu_cache_usage_perc`` -> ``kv_cache_usage_perc``,
``time_per_output_token_seconds`` -> ``inter_token_latency_seconds``, ...) are aliases in the
catalogue. The cache geometry exists only as labels of the info gauge
``vllm:cache_config_info`` (one series per rank, without ``model_name``): block size is the
same on every rank, GPU blocks add up across ranks, and the model is the one the page's
other series name. Of the settings ``inferwatch advise`` proposes, the page tells only
``gpu_memory_utilization`` (a label of the same gauge); ``GET /v1/models`` tells
``max_model_len``; the batch limits are told nowhere.

As a Triton backend (Triton's vLLM backend), vLLM's families are served on Triton's page
labelled Triton's way: ``model`` and ``version`` (the Triton model and its version) instead
of ``model_name``; they become our ``model`` and ``model_version``. The labels of the
``vllm:`` samples tell which: Triton's own ``nv_*`` families may or may not be on the page.
"""

from __future__ import annotations

from inferwatch.exporters.engine.adapters.adapter import (
    Adapter,
    Host,
    JsonField,
    LabelValue,
    VersionEndpoint,
)

ADAPTER = Adapter(
    name="vllm",
    identity_labels={"model": "model_name"},
    served_model_family="vllm:num_requests_running",
    derived={
        "engine_kv_cache_block_size": LabelValue("vllm:cache_config_info", "block_size"),
        "engine_kv_cache_blocks": LabelValue("vllm:cache_config_info", "num_gpu_blocks"),
    },
    version_endpoints=(VersionEndpoint("/version", {"engine_version": ("version",)}),),
    settings={
        "gpu_memory_utilization": (LabelValue("vllm:cache_config_info", "gpu_memory_utilization"),),
        "max_model_len": (JsonField("/v1/models", ("data", 0, "max_model_len")),),
    },
    hosts=(Host("triton", identity_labels={"model": "model", "model_version": "version"}),),
)
