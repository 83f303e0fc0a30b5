"""SGLang (``--enable-metrics``), under either spelling, ``sglang:`` or ``sglang_``.

Scheduler series carry ``tp_rank``, ``pp_rank`` and ``moe_ep_rank`` (plus ``dp_rank``,
``engine_type``, ``priority`` and operator-added labels); request series carry
``is_streaming``. By default only attention-TP rank 0 reports, but with
``--enable-metrics-for-all-schedulers`` every tensor/pipeline/expert-parallel rank reports the
same batch, so those three labels are treated as replicas (collapsed by max) while data-parallel
ranks and request partitions are summed. The KV-cache geometry is published as labels of
``sglang:cache_config_info`` (``page_size``, ``num_pages``). ``GET /get_server_info`` returns
the server arguments, the settings among them (null where the launcher left one unset).
"""

from __future__ import annotations

from inferwatch.exporters.engine.adapters.adapter import (
    Adapter,
    JsonField,
    LabelValue,
    VersionEndpoint,
)

ADAPTER = Adapter(
    name="sglang",
    identity_labels={"model": "model_name"},
    served_model_family="sglang:num_running_reqs",
    replica_labels=frozenset({"tp_rank", "pp_rank", "moe_ep_rank"}),
    derived={
        "engine_kv_cache_block_size": LabelValue("sglang:cache_config_info", "page_size"),
        "engine_kv_cache_blocks": LabelValue("sglang:cache_config_info", "num_pages"),
    },
    version_endpoints=(
        VersionEndpoint(
            "/get_server_info",
            {"engine_version": ("version",), "model": ("served_model_name", "model_path")},
        ),
        VersionEndpoint("/version", {"engine_version": ("version",)}),
    ),
    settings={
        "gpu_memory_utilization": (JsonField("/get_server_info", ("mem_fraction_static",)),),
        "max_num_seqs": (JsonField("/get_server_info", ("max_running_requests",)),),
        "max_num_batched_tokens": (JsonField("/get_server_info", ("chunked_prefill_size",)),),
        "max_model_len": (JsonField("/get_server_info", ("context_length",)),),
    },
)
