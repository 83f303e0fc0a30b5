"""The simulator's /metrics: vLLM 0.33's families, names, types, labels and buckets.

These are spelled here rather than taken from the inferwatch catalogue because the simulator
plays the engine: it must look exactly like vLLM to the sidecar that scrapes it. The family
set, order, HELP texts, label names and bucket boundaries are those of a real vLLM 0.33.0
exposition (the shared capture engines/vllm-generated-0.33.0-1engine.prom, and
vllm-generated-0.33.0-specdec-lora.prom for the speculative-decoding families vLLM registers
only when a speculative config is set); a test compares them.
Each server has its own CollectorRegistry; engine ranks are children labelled ``engine``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
)

from inferwatch.sim.specdecode import Speculation

RANK_LABELS = ("engine", "model_name")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
HTTP_HIGHR_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
)
HTTP_BUCKETS = (0.1, 0.5, 1.0)
# vLLM's CacheConfig.metrics_info() label names in 0.33.0 (values: the simulated config).
CACHE_CONFIG_LABELS = (
    "_block_size_resolved",
    "block_size",
    "cache_dtype",
    "cache_hit_alignment_tokens",
    "effective_attention_block_size",
    "enable_mamba_shared_prefix_checkpoint",
    "enable_prefix_caching",
    "engine",
    "gpu_memory_utilization",
    "hash_block_size",
    "is_attention_free",
    "kv_cache_dtype_skip_layers",
    "kv_cache_layout",
    "kv_cache_max_concurrency",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
    "kv_offloading_backend",
    "kv_offloading_size",
    "kv_sharing_fast_prefill",
    "mamba_block_size",
    "mamba_cache_dtype",
    "mamba_cache_mode",
    "mamba_page_size_padded",
    "mamba_ssm_cache_dtype",
    "num_cpu_blocks",
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "prefix_cache_retention_interval",
    "prefix_caching_hash_algo",
    "prefix_match_unit",
    "replayssm_buffer_len",
    "simple_cpu_offload_num_blocks",
    "skip_page_size_padded",
    "sliding_window",
    "swa_bounded_replay",
    "use_kda_recoverssm",
    "use_replayssm",
    "user_specified_block_size",
)
_CACHE_CONFIG_DEFAULTS = {
    "_block_size_resolved": "True",
    "cache_dtype": "auto",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_offloading_backend": "native",
    "kv_sharing_fast_prefill": "False",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "0",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "replayssm_buffer_len": "16",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}
# prometheus-fastapi-instrumentator as vLLM configures it skips these handlers.
UNINSTRUMENTED_PATHS = frozenset(
    {"/metrics", "/health", "/load", "/ping", "/version", "/server_info"}
)


def buckets_1_2_5(max_value: int) -> list[int]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


@dataclass(frozen=True)
class FinishedRequest:
    """What vLLM records when a request finishes (times in seconds)."""

    finished_reason: str
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    e2e: float
    queue: float
    prefill: float
    decode: float
    inference: float
    preemptions: int


class RankMetrics:
    """The series of one engine rank (label values bound), updated as vLLM updates them."""

    def __init__(self, metrics: VllmMetrics, engine: str) -> None:
        labels = {"engine": engine, "model_name": metrics.model_name}
        counters, gauges, histograms = metrics.counters, metrics.gauges, metrics.histograms
        for name in ("estimated_flops", "estimated_read", "estimated_write", "external_queries",
                     "external_hits", "mm_queries", "mm_hits"):  # fmt: skip
            counters[name].labels(**labels)  # present and zero, as in vLLM
        self.running = gauges["running"].labels(**labels)
        self.waiting = gauges["waiting"].labels(**labels)
        self.waiting_capacity = gauges["waiting_by_reason"].labels(**labels, reason="capacity")
        gauges["waiting_by_reason"].labels(**labels, reason="deferred")
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            gauges["sleep_state"].labels(**labels, sleep_state=state).set(value)
        self.kv_usage = gauges["kv_usage"].labels(**labels)
        self.prefix_queries = counters["prefix_queries"].labels(**labels)
        self.prefix_hits = counters["prefix_hits"].labels(**labels)
        self.preemptions = counters["preemptions"].labels(**labels)
        self.prompt_tokens = counters["prompt_tokens"].labels(**labels)
        by_source = counters["prompt_by_source"]
        self.computed_tokens = by_source.labels(**labels, source="local_compute")
        self.cache_hit_tokens = by_source.labels(**labels, source="local_cache_hit")
        by_source.labels(**labels, source="external_kv_transfer")
        self.cached_tokens = counters["prompt_cached"].labels(**labels)
        cached_by_source = counters["prompt_cached_by_source"]
        self.cached_device = cached_by_source.labels(**labels, source="device")
        for source in ("host", "p2p", "disk", "external_unspecified"):
            cached_by_source.labels(**labels, source=source)
        self.generation_tokens = counters["generation_tokens"].labels(**labels)
        self.success = {
            reason: counters["success"].labels(**labels, finished_reason=reason)
            for reason in FINISHED_REASONS
        }
        self.h = {name: family.labels(**labels) for name, family in histograms.items()}
        spec = metrics.spec_decode
        self.spec = {name: spec[name].labels(**labels) for name in spec if name != "pos"}
        self.spec_positions = [
            spec["pos"].labels(**labels, position=str(position))
            for position in range(metrics.num_speculative_tokens if spec else 0)
        ]

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A request (new or resumed) was scheduled and looked up in the prefix cache."""
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(cached_tokens)
        self.cached_device.inc(cached_tokens)

    def first_token(self, prompt_tokens: int, cached_tokens: int, ttft: float) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.computed_tokens.inc(prompt_tokens - cached_tokens)
        self.cache_hit_tokens.inc(cached_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.h["prefill_kv_computed"].observe(prompt_tokens - cached_tokens)
        self.h["ttft"].observe(ttft)
        self.generation_tokens.inc()

    def next_token(self, interval: float) -> None:
        self.h["itl"].observe(interval)
        self.generation_tokens.inc()

    def speculated(self, step: Speculation) -> None:
        """One step's drafts, as vLLM's SpecDecodingStats.observe_draft adds them up."""
        self.spec["drafts"].inc(step.drafts)
        self.spec["draft_tokens"].inc(step.draft_tokens)
        self.spec["accepted"].inc(step.accepted)
        for child, accepted in zip(self.spec_positions, step.accepted_per_position, strict=True):
            child.inc(accepted)

    def finished(self, done: FinishedRequest) -> None:
        self.success[done.finished_reason].inc()
        h = self.h
        h["request_prompt_tokens"].observe(done.prompt_tokens)
        h["request_generation_tokens"].observe(done.generation_tokens)
        h["max_generation_tokens"].observe(done.max_tokens)
        h["params_n"].observe(1)
        h["params_max_tokens"].observe(done.max_tokens)
        h["e2e"].observe(done.e2e)
        h["queue_time"].observe(done.queue)
        h["inference_time"].observe(done.inference)
        h["prefill_time"].observe(done.prefill)
        h["decode_time"].observe(done.decode)
        h["request_preemptions"].observe(done.preemptions)
        if done.generation_tokens > 1:
            h["tpot"].observe(done.decode / (done.generation_tokens - 1))


_MFU = "(for Model Flops Utilization calculations)."
_QUERIED = "in terms of number of queried tokens."
_CACHED = "in terms of number of cached tokens."
_EXTERNAL = "External prefix cache {} from KV connector cross-instance cache sharing, {}"
_PHASE = "Histogram of time spent in {} phase for request."
_SIZE = "Only value of header is respected. Otherwise ignored. No percentile calculated. "
# (attribute, type, name, help, extra label); histograms: (attribute, name, help, buckets)
# with "tokens" meaning the 1-2-5 series up to max_model_len.
_RANK_FAMILIES: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "estimated_flops",
        "counter",
        "vllm:estimated_flops_per_gpu",
        f"Estimated number of floating point operations per GPU {_MFU}",
        "",
    ),
    (
        "estimated_read",
        "counter",
        "vllm:estimated_read_bytes_per_gpu",
        f"Estimated number of bytes read from memory per GPU {_MFU}",
        "",
    ),
    (
        "estimated_write",
        "counter",
        "vllm:estimated_write_bytes_per_gpu",
        f"Estimated number of bytes written to memory per GPU {_MFU}",
        "",
    ),
    (
        "running",
        "gauge",
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        "",
    ),
    (
        "waiting",
        "gauge",
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        "",
    ),
    (
        "waiting_by_reason",
        "gauge",
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
        "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
        "blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        "reason",
    ),
    (
        "sleep_state",
        "gauge",
        "vllm:engine_sleep_state",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
        "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        "sleep_state",
    ),
    (
        "kv_usage",
        "gauge",
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        "",
    ),
    (
        "prefix_queries",
        "counter",
        "vllm:prefix_cache_queries",
        f"Prefix cache queries, {_QUERIED}",
        "",
    ),
    ("prefix_hits", "counter", "vllm:prefix_cache_hits", f"Prefix cache hits, {_CACHED}", ""),
    (
        "external_queries",
        "counter",
        "vllm:external_prefix_cache_queries",
        _EXTERNAL.format("queries", _QUERIED),
        "",
    ),
    (
        "external_hits",
        "counter",
        "vllm:external_prefix_cache_hits",
        _EXTERNAL.format("hits", _CACHED),
        "",
    ),
    (
        "mm_queries",
        "counter",
        "vllm:mm_cache_queries",
        "Multi-modal cache queries, in terms of number of queried items.",
        "",
    ),
    (
        "mm_hits",
        "counter",
        "vllm:mm_cache_hits",
        "Multi-modal cache hits, in terms of number of cached items.",
        "",
    ),
    (
        "preemptions",
        "counter",
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        "",
    ),
    ("prompt_tokens", "counter", "vllm:prompt_tokens", "Number of prefill tokens processed.", ""),
    (
        "prompt_by_source",
        "counter",
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        "source",
    ),
    (
        "prompt_cached",
        "counter",
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        "",
    ),
    (
        "prompt_cached_by_source",
        "counter",
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
        "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
        "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
        "vllm:external_prefix_cache_hits.",
        "source",
    ),
    (
        "generation_tokens",
        "counter",
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        "",
    ),
    (
        "success",
        "counter",
        "vllm:request_success",
        "Count of successfully processed requests.",
        "finished_reason",
    ),
)
_HISTOGRAMS: tuple[tuple[str, str, str, tuple[float, ...] | str], ...] = (
    ("request_prompt_tokens", "vllm:request_prompt_tokens",
     "Number of prefill tokens processed.", "tokens"),
    ("request_generation_tokens", "vllm:request_generation_tokens",
     "Number of generation tokens processed.", "tokens"),
    ("iteration_tokens", "vllm:iteration_tokens_total",
     "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS),
    ("max_generation_tokens", "vllm:request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens.", "tokens"),
    ("params_n", "vllm:request_params_n",
     "Histogram of the n request parameter.", PARAMS_N_BUCKETS),
    ("params_max_tokens", "vllm:request_params_max_tokens",
     "Histogram of the max_tokens request parameter.", "tokens"),
    ("ttft", "vllm:time_to_first_token_seconds",
     "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("itl", "vllm:inter_token_latency_seconds",
     "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    ("tpot", "vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS),
    ("e2e", "vllm:e2e_request_latency_seconds",
     "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
    ("queue_time", "vllm:request_queue_time_seconds", _PHASE.format("WAITING"),
     REQUEST_LATENCY_BUCKETS),
    ("inference_time", "vllm:request_inference_time_seconds", _PHASE.format("RUNNING"),
     REQUEST_LATENCY_BUCKETS),
    ("prefill_time", "vllm:request_prefill_time_seconds", _PHASE.format("PREFILL"),
     REQUEST_LATENCY_BUCKETS),
    ("decode_time", "vllm:request_decode_time_seconds", _PHASE.format("DECODE"),
     REQUEST_LATENCY_BUCKETS),
    ("request_preemptions", "vllm:request_num_preemptions",
     "Histogram of the number of times a request was preempted.", PREEMPTION_BUCKETS),
    ("prefill_kv_computed", "vllm:request_prefill_kv_computed_tokens",
     "Histogram of new KV tokens computed during prefill (excluding cached tokens).", "tokens"),
)  # fmt: skip


_SPEC_DECODE: tuple[tuple[str, str, str], ...] = (
    ("drafts", "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
    ("draft_tokens", "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
    ("accepted", "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
    ("pos", "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position."),
)


class VllmMetrics:
    """All families of one simulated vLLM server, registered in vLLM's order."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        cache_config: Mapping[int, Mapping[str, str]],
        num_speculative_tokens: int = 0,
    ) -> None:
        self.model_name = model_name
        self.num_speculative_tokens = num_speculative_tokens
        self.registry = registry = CollectorRegistry()
        for collector in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
            registry.register(collector)
        self.spec_decode: dict[str, Counter] = {}
        for attribute, name, doc in _SPEC_DECODE if num_speculative_tokens else ():
            names = [*RANK_LABELS, "position"] if attribute == "pos" else list(RANK_LABELS)
            self.spec_decode[attribute] = Counter(name, doc, names, registry=registry)
        self.counters: dict[str, Counter] = {}
        self.gauges: dict[str, Gauge] = {}
        self.histograms: dict[str, Histogram] = {}
        for attribute, kind, name, doc, extra in _RANK_FAMILIES:
            labels = sorted((*RANK_LABELS, extra)) if extra else list(RANK_LABELS)
            if kind == "counter":
                self.counters[attribute] = Counter(name, doc, labels, registry=registry)
            else:
                self.gauges[attribute] = Gauge(name, doc, labels, registry=registry)
        admission = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ("model_name", "reason"),
            registry=registry,
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            admission.labels(model_name=model_name, reason=reason)
        token_buckets = tuple(buckets_1_2_5(max_model_len))
        for attribute, name, doc, buckets in _HISTOGRAMS:
            bounds = token_buckets if buckets == "tokens" else buckets
            self.histograms[attribute] = Histogram(
                name, doc, RANK_LABELS, buckets=bounds, registry=registry
            )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            CACHE_CONFIG_LABELS,
            registry=registry,
        )
        for engine, values in cache_config.items():
            info_labels = dict.fromkeys(CACHE_CONFIG_LABELS, "None")
            info_labels.update(_CACHE_CONFIG_DEFAULTS)
            info_labels.update(values)
            info_labels["engine"] = str(engine)
            info.labels(**info_labels).set(1)
        self.http_requests = Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ("handler", "method", "status"),
            registry=registry,
        )
        self.http_request_size = Summary(
            "http_request_size_bytes",
            f"Content length of incoming requests by handler. {_SIZE}",
            ("handler",),
            registry=registry,
        )
        self.http_response_size = Summary(
            "http_response_size_bytes",
            f"Content length of outgoing responses by handler. {_SIZE}",
            ("handler",),
            registry=registry,
        )
        self.http_highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ",
            buckets=HTTP_HIGHR_BUCKETS,
            registry=registry,
        )
        self.http_duration = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by "
            "handler is important. ",
            ("handler", "method"),
            buckets=HTTP_BUCKETS,
            registry=registry,
        )
        self.ranks = {engine: RankMetrics(self, str(engine)) for engine in cache_config}

    def observe_http(
        self,
        handler: str,
        method: str,
        status: int,
        request_bytes: int,
        response_bytes: int,
        seconds: float,
    ) -> None:
        status_class = f"{status // 100}xx"
        self.http_requests.labels(handler=handler, method=method, status=status_class).inc()
        self.http_request_size.labels(handler=handler).observe(request_bytes)
        self.http_response_size.labels(handler=handler).observe(response_bytes)
        self.http_highr.observe(seconds)
        self.http_duration.labels(handler=handler, method=method).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
