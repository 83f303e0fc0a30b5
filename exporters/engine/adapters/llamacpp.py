"""llama.cpp server (``llama-server --metrics``): label-free counters and gauges, no histograms.

``llamacpp:prompt_tokens_total`` counts prompt tokens the server computed, cached ones
excluded (the HELP text says so since builds that added ``llamacpp:prompt_tokens_cached_total``).
To mean the same as every other engine (all prompt tokens), the prompt-token signal adds the
cached counter back where it exists; and the two counters together give the prefix cache's
queried tokens (computed + cached) and hit tokens (cached). Inter-token latency is known only
as a mean: decode seconds (``tokens_predicted_seconds_total``, summed per slot, i.e. per
request clock) over decoded tokens, written as a sum-and-count histogram. There is no
time-to-first-token, end-to-end latency, KV-cache gauge (removed in 2025) or error counter.
``GET /props`` tells the slots (``--parallel``: the batch limit) and each slot's context
(``n_ctx``: the longest request).
"""

from __future__ import annotations

from inferwatch.catalog import Alias
from inferwatch.exporters.engine.adapters.adapter import (
    Adapter,
    JsonField,
    SumCount,
    Total,
    VersionEndpoint,
)

_COMPUTED = Alias("llamacpp:prompt_tokens")
_CACHED = Alias("llamacpp:prompt_tokens_cached")

ADAPTER = Adapter(
    name="llamacpp",
    derived={
        "engine_prompt_tokens": Total(required=(_COMPUTED,), optional=(_CACHED,)),
        "engine_prefix_cache_queried_tokens": Total(required=(_COMPUTED, _CACHED)),
        "engine_prefix_cache_hit_tokens": Total(required=(_CACHED,)),
        "engine_inter_token_latency": SumCount(
            sum=(Alias("llamacpp:tokens_predicted_seconds"),),
            count=Alias("llamacpp:tokens_predicted"),
        ),
    },
    version_endpoints=(
        VersionEndpoint(
            "/props", {"engine_version": ("build_info",), "model": ("model_alias", "model_path")}
        ),
    ),
    settings={
        "max_num_seqs": (JsonField("/props", ("total_slots",)),),
        "max_model_len": (JsonField("/props", ("default_generation_settings", "n_ctx")),),
    },
)
