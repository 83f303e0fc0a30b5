"""Capacity model: how a model, a GPU and vLLM-style serving settings divide GPU memory.

The arithmetic follows vLLM V1's own start-up accounting, so that the numbers printed here can
be checked against the lines vLLM logs ("Model loading took X GiB", "Available KV cache memory",
"GPU KV cache size: N tokens", "Maximum concurrency for L tokens per request"):

* budget      = usable GPU memory x gpu_memory_utilization
* weights     = parameters x bytes per parameter, split over tensor-parallel ranks; quantized
                checkpoints keep their embeddings in 16 bits
* reserve     = the profile run's peak activations plus non-torch memory (see
                :func:`activation_reserve_bytes`)
* KV memory   = budget - weights - reserve
* KV blocks   = KV memory // (block_size x KV bytes per token on one GPU)
* concurrency = blocks / ceil(context / block_size)

The simulator (:mod:`inferwatch.sim`) sizes its paged KV cache with the same functions, so a
simulated replica runs out of blocks where the real one would.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

GIB = 1024**3
MIB = 1024**2


class CapacityError(ValueError):
    """A model, GPU or setting that cannot be sized; the message is one sentence for a user."""


# Bytes per stored element. int4 adds one fp16 scale and one fp16 zero point per group of 128
# weights (AWQ/GPTQ layout), which is 4/128 of a byte per weight.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5 + 4 / 128,
}
DTYPE_ALIASES = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}


def normalize_dtype(name: str) -> str:
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPE_BYTES:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise CapacityError(f"unknown dtype {name!r}; use one of {known}")
    return key


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as a Hugging Face config.json describes it."""

    name: str
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bf16"
    tie_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    experts: int = 0  # 0 for a dense model
    experts_per_token: int = 0
    max_position_embeddings: int = 131072

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def attention_params_per_layer(self) -> int:
        q = self.attention_heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        params = 2 * self.hidden_size * q + 2 * self.hidden_size * kv
        if self.attention_bias:
            params += q + 2 * kv
        if self.qk_norm:
            params += 2 * self.head_dim
        return params

    @property
    def mlp_params_per_expert(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up and down projections

    @property
    def expert_params(self) -> int:
        """All expert MLP weights of the model (0 when dense)."""
        return self.layers * self.experts * self.mlp_params_per_expert

    @property
    def params(self) -> int:
        per_layer = self.attention_params_per_layer + 2 * self.hidden_size  # two RMSNorms
        if self.experts:
            per_layer += self.experts * self.mlp_params_per_expert + self.hidden_size * self.experts
        else:
            per_layer += self.mlp_params_per_expert
        return self.layers * per_layer + self.embedding_params + self.hidden_size

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (all of them for a dense model)."""
        if not self.experts:
            return self.params
        idle = self.experts - self.experts_per_token
        return self.params - self.layers * idle * self.mlp_params_per_expert


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator: memory as CUDA reports it, peak bandwidth and bf16 dense FLOP/s.

    The power, clock and temperature figures drive the simulator's DCGM endpoint.
    """

    name: str
    model_name: str  # as NVML/DCGM print it (modelName label)
    total_bytes: int  # framebuffer size (DCGM FB_USED + FB_FREE + FB_RESERVED)
    reserved_bytes: int  # held by the driver; CUDA never sees it
    bandwidth: float  # bytes/s
    bf16_flops: float  # dense FLOP/s
    tdp_watts: float
    idle_watts: float
    idle_temp_c: float
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    mem_clock_mhz: int
    #: the GPU's own thermal limits (NVML's temperature thresholds, DCGM's SLOWDOWN_TEMP and
    #: SHUTDOWN_TEMP fields)
    slowdown_temp_c: int = 89
    shutdown_temp_c: int = 95
    #: NVLink links the board reports (0: a PCIe board, whose NVLink fields DCGM leaves blank)
    nvlinks: int = 0

    @property
    def memory_bytes(self) -> int:
        """What torch.cuda.mem_get_info() calls total, the base of gpu_memory_utilization."""
        return self.total_bytes - self.reserved_bytes


@dataclass(frozen=True)
class ServingSpec:
    """vLLM serving flags that change the memory split (None means vLLM's default)."""

    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.92  # vLLM 0.33 default (cache_config_info in the fixture)
    block_size: int = 16
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    weight_dtype: str | None = None  # default: the model's dtype
    kv_cache_dtype: str = "auto"  # auto: the model's dtype
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    reserve_bytes: int | None = None  # override the activation/overhead estimate


@dataclass(frozen=True)
class Capacity:
    """The memory split of one tensor-parallel rank (all ranks are alike)."""

    model: ModelSpec
    gpu: GPUSpec
    serving: ServingSpec = field(repr=False)
    weight_dtype: str
    kv_cache_dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    budget_bytes: int
    weight_bytes: int
    reserve_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int  # whole model, all ranks together
    kv_bytes_per_token_per_gpu: int
    num_blocks: int

    @property
    def block_size(self) -> int:
        return self.serving.block_size

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_per_sequence(self, context: int) -> int:
        return math.ceil(context / self.block_size)

    def max_concurrency(self, context: int) -> float:
        """vLLM's "Maximum concurrency for <context> tokens per request"."""
        return self.num_blocks / self.blocks_per_sequence(context)

    def max_sequences(self, context: int) -> int:
        """Sequences of ``context`` tokens that fit at once; one more starts preemption."""
        return self.num_blocks // self.blocks_per_sequence(context)

    @property
    def longest_sequence(self) -> int:
        """The largest max_model_len whose single sequence still fits the KV cache."""
        return self.kv_tokens

    @property
    def min_gpu_memory_utilization(self) -> float:
        """The smallest gpu_memory_utilization that starts with one max_model_len sequence."""
        one_sequence = self.blocks_per_sequence(self.max_model_len) * self.block_size
        needed = (
            self.weight_bytes + self.reserve_bytes + one_sequence * self.kv_bytes_per_token_per_gpu
        )
        return needed / self.gpu.memory_bytes

    @property
    def problem(self) -> str | None:
        """Why this configuration cannot start (one sentence), or None when it fits."""
        name = f"{self.model.name} ({self.weight_dtype}, TP {self.serving.tensor_parallel}) on "
        name += self.gpu.name
        budget, utilization = self.budget_bytes / GIB, self.serving.gpu_memory_utilization
        if self.weight_bytes > self.budget_bytes:
            return (
                f"{name} needs {self.weight_bytes / GIB:.2f} GiB of weights per GPU but "
                f"gpu-memory-utilization {utilization} leaves {budget:.2f} GiB"
            )
        if self.kv_bytes <= 0:
            return (
                f"{name} has no memory left for the KV cache: {self.weight_bytes / GIB:.2f} GiB "
                f"of weights and {self.reserve_bytes / GIB:.2f} GiB of activations exceed the "
                f"{budget:.2f} GiB budget"
            )
        if self.blocks_per_sequence(self.max_model_len) > self.num_blocks:
            return (
                f"{name} cannot hold one {self.max_model_len}-token sequence: the KV cache has "
                f"room for {self.kv_tokens} tokens"
            )
        return None

    def to_dict(self, context: int | None = None) -> dict[str, Any]:
        context = context or self.max_model_len
        return {
            "fits": self.problem is None,
            "problem": self.problem,
            "model": self.model.name,
            "params": self.model.params,
            "active_params": self.model.active_params,
            "gpu": self.gpu.name,
            "tensor_parallel": self.serving.tensor_parallel,
            "gpu_memory_bytes": self.gpu.memory_bytes,
            "gpu_memory_utilization": self.serving.gpu_memory_utilization,
            "weight_dtype": self.weight_dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "budget_bytes": self.budget_bytes,
            "weight_bytes": self.weight_bytes,
            "reserve_bytes": self.reserve_bytes,
            "kv_bytes": self.kv_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "num_blocks": self.num_blocks,
            "kv_tokens": self.kv_tokens,
            "context": context,
            "max_concurrency": round(self.max_concurrency(context), 2),
            "max_sequences": self.max_sequences(context),
            "preemption_from_sequences": self.max_sequences(context) + 1,
            "longest_sequence": self.longest_sequence,
            "min_gpu_memory_utilization": round(self.min_gpu_memory_utilization, 4),
        }


# Fitted to the four vLLM V1 profile runs on one H100 published in llm-d/llm-d-benchmark
# (config_explorer/empirical-vllm-memory-results.md): Llama-3.1-8B 4.76 GiB, Llama-3.3-70B-FP8
# TP=2 4.84, Qwen3-32B 5.64, Qwen3-0.6B 5.56, all within 0.02 GiB. The sampler's dummy run holds
# about 9.6 float32 copies of the [max_num_seqs x vocab] logits, the forward pass about 1.3
# 16-bit copies of the [max_num_batched_tokens x hidden] activations.
_LOGIT_COPIES = 9.565
_HIDDEN_COPIES = 1.28
# "Non-torch memory" in the same logs: CUDA context and allocator slack, plus NCCL buffers
# when tensor parallelism is on.
_NON_TORCH_BYTES = int(0.13 * GIB)
_NCCL_BYTES = int(0.42 * GIB)


def activation_reserve_bytes(
    model: ModelSpec, max_num_seqs: int, max_num_batched_tokens: int, tensor_parallel: int
) -> int:
    """Memory vLLM's profile run takes besides weights and KV cache, on one rank."""
    logits = max_num_seqs * model.vocab_size * 4
    hidden = max_num_batched_tokens * model.hidden_size * 2
    non_torch = _NON_TORCH_BYTES + (_NCCL_BYTES if tensor_parallel > 1 else 0)
    return int(_LOGIT_COPIES * logits + _HIDDEN_COPIES * hidden) + non_torch


def default_batch_limits(gpu: GPUSpec) -> tuple[int, int]:
    """vLLM's server defaults (max_num_seqs, max_num_batched_tokens) for this GPU.

    vLLM raises both on GPUs with at least 70 GiB that are not A100s (arg_utils.py).
    """
    if gpu.memory_bytes >= 70 * GIB and "A100" not in gpu.model_name:
        return 1024, 8192
    return 256, 2048


def weight_bytes_per_gpu(model: ModelSpec, weight_dtype: str, tensor_parallel: int) -> int:
    per_weight = DTYPE_BYTES[weight_dtype]
    embedding_bytes = max(per_weight, DTYPE_BYTES[model.dtype])  # never quantized
    total = (model.params - model.embedding_params) * per_weight
    total += model.embedding_params * embedding_bytes
    return int(total / tensor_parallel)


def kv_heads_per_gpu(model: ModelSpec, tensor_parallel: int) -> int:
    """KV heads are split over ranks, and replicated when there are fewer heads than ranks."""
    return max(1, model.kv_heads // tensor_parallel)


def compute(model: ModelSpec, gpu: GPUSpec, serving: ServingSpec | None = None) -> Capacity:
    """Size one rank; raises CapacityError when the configuration cannot start."""
    capacity = size(model, gpu, serving)
    problem = capacity.problem
    if problem is not None:
        fixes = suggest(model, gpu, capacity.serving)
        hint = "; try " + " or ".join(fix.flags for fix in fixes) if fixes else ""
        raise CapacityError(problem + hint)
    return capacity


def size(model: ModelSpec, gpu: GPUSpec, serving: ServingSpec | None = None) -> Capacity:
    """The memory split of one rank, whether or not it can start (see ``Capacity.problem``).

    Raises CapacityError only for settings that cannot be sized at all.
    """
    serving = serving or ServingSpec()
    tp = serving.tensor_parallel
    if tp < 1 or model.attention_heads % tp:
        raise CapacityError(
            f"tensor parallel {tp} must divide the {model.attention_heads} attention heads"
        )
    if not 0 < serving.gpu_memory_utilization <= 1:
        raise CapacityError("gpu-memory-utilization must be in (0, 1]")
    if serving.block_size < 1:
        raise CapacityError("block size must be a positive number of tokens")
    weight_dtype = normalize_dtype(serving.weight_dtype or model.dtype)
    kv_dtype = normalize_dtype(
        model.dtype if serving.kv_cache_dtype == "auto" else serving.kv_cache_dtype
    )
    if kv_dtype == "int4":
        raise CapacityError("the KV cache cannot be int4; use auto, bf16, fp16 or fp8")
    max_model_len = serving.max_model_len or model.max_position_embeddings
    default_seqs, default_tokens = default_batch_limits(gpu)
    max_num_seqs = serving.max_num_seqs or default_seqs
    max_num_batched_tokens = serving.max_num_batched_tokens or default_tokens

    budget = int(gpu.memory_bytes * serving.gpu_memory_utilization)
    weights = weight_bytes_per_gpu(model, weight_dtype, tp)
    reserve = serving.reserve_bytes
    if reserve is None:
        reserve = activation_reserve_bytes(model, max_num_seqs, max_num_batched_tokens, tp)
    kv_bytes = budget - weights - reserve
    per_token_gpu = int(
        2 * model.layers * kv_heads_per_gpu(model, tp) * model.head_dim * DTYPE_BYTES[kv_dtype]
    )
    per_token = int(2 * model.layers * model.kv_heads * model.head_dim * DTYPE_BYTES[kv_dtype])
    num_blocks = max(0, kv_bytes) // (serving.block_size * per_token_gpu)
    return Capacity(
        model=model,
        gpu=gpu,
        serving=serving,
        weight_dtype=weight_dtype,
        kv_cache_dtype=kv_dtype,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        budget_bytes=budget,
        weight_bytes=weights,
        reserve_bytes=reserve,
        kv_bytes=kv_bytes,
        kv_bytes_per_token=per_token,
        kv_bytes_per_token_per_gpu=per_token_gpu,
        num_blocks=num_blocks,
    )


# --- what to change when it does not fit ----------------------------------------------------------
#: tensor-parallel sizes worth suggesting: the GPUs of one node
TENSOR_PARALLEL_SIZES = (2, 4, 8)


@dataclass(frozen=True)
class Suggestion:
    """A change of serving flags under which the configuration starts."""

    flags: str  # as typed on the command line, e.g. "--tensor-parallel 2 --kv-cache-dtype fp8"
    serving: ServingSpec = field(repr=False)


def _more_tensor_parallel(
    model: ModelSpec, gpu: GPUSpec, serving: ServingSpec
) -> Suggestion | None:
    """The fewest GPUs whose shares of the weights leave room for a KV cache."""
    for tp in TENSOR_PARALLEL_SIZES:
        if tp > serving.tensor_parallel and model.attention_heads % tp == 0:
            wider = replace(serving, tensor_parallel=tp)
            if size(model, gpu, wider).kv_bytes > 0:
                return Suggestion(f"--tensor-parallel {tp}", wider)
    return None


def _fp8_kv_cache(model: ModelSpec, gpu: GPUSpec, serving: ServingSpec) -> Suggestion | None:
    current = model.dtype if serving.kv_cache_dtype == "auto" else serving.kv_cache_dtype
    if DTYPE_BYTES[normalize_dtype(current)] <= DTYPE_BYTES["fp8"]:
        return None
    return Suggestion("--kv-cache-dtype fp8", replace(serving, kv_cache_dtype="fp8"))


def _fp8_weights(model: ModelSpec, gpu: GPUSpec, serving: ServingSpec) -> Suggestion | None:
    if DTYPE_BYTES[normalize_dtype(serving.weight_dtype or model.dtype)] <= DTYPE_BYTES["fp8"]:
        return None
    return Suggestion("--weight-dtype fp8", replace(serving, weight_dtype="fp8"))


def _shorter_max_model_len(
    model: ModelSpec, gpu: GPUSpec, serving: ServingSpec
) -> Suggestion | None:
    capacity = size(model, gpu, serving)
    if capacity.kv_tokens < 1 or capacity.kv_tokens >= capacity.max_model_len:
        return None
    length = capacity.kv_tokens
    return Suggestion(f"--max-model-len {length}", replace(serving, max_model_len=length))


def _more_memory_utilization(
    model: ModelSpec, gpu: GPUSpec, serving: ServingSpec
) -> Suggestion | None:
    # rounded up to the hundredth; the flag's range is (0, 1]
    utilization = math.ceil(size(model, gpu, serving).min_gpu_memory_utilization * 100) / 100
    if not serving.gpu_memory_utilization < utilization <= 1.0:
        return None
    return Suggestion(
        f"--gpu-memory-utilization {utilization:g}",
        replace(serving, gpu_memory_utilization=utilization),
    )


_CHANGES = (
    _more_tensor_parallel,
    _fp8_kv_cache,
    _fp8_weights,
    _shorter_max_model_len,
    _more_memory_utilization,
)


def suggest(model: ModelSpec, gpu: GPUSpec, serving: ServingSpec) -> list[Suggestion]:
    """Changes of one flag under which the configuration starts; else pairs of changes.

    Every value is one the flag accepts and every change is checked by sizing it again.
    """

    def fits(candidate: Suggestion) -> bool:
        return size(model, gpu, candidate.serving).problem is None

    if size(model, gpu, serving).problem is None:
        return []
    singles = [s for change in _CHANGES if (s := change(model, gpu, serving)) is not None]
    found = [s for s in singles if fits(s)]
    if found:
        return found
    for first in singles:
        for change in _CHANGES:
            second = change(model, gpu, first.serving)
            if second is None or second.flags.split()[0] == first.flags.split()[0]:
                continue
            pair = Suggestion(f"{first.flags} {second.flags}", second.serving)
            if fits(pair) and pair.flags not in {s.flags for s in found}:
                found.append(pair)
    return found


# --- presets ------------------------------------------------------------------------------------
# Model presets are the relevant keys of each model's published config.json, so that a preset and
# a user's config.json go through the same parser.


def _config(
    model_type: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int | None,
    intermediate: int,
    vocab: int,
    max_positions: int,
    experts: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One checkpoint's config.json keys, written as a table row like the GPU presets.

    head_dim is None where the checkpoint's config.json leaves it out (it is then derived from
    hidden_size and num_attention_heads); experts is (num_local_experts, num_experts_per_tok)
    for a mixture of experts. Every preset unties its embeddings and ships bf16 weights.
    """
    config: dict[str, Any] = {
        "model_type": model_type,
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": max_positions,
    }
    if head_dim is not None:
        config["head_dim"] = head_dim
    if experts is not None:
        config["num_local_experts"], config["num_experts_per_tok"] = experts
    return config


# Columns: model_type, layers, hidden, heads, KV heads, head_dim, intermediate, vocab,
# max_position_embeddings[, (experts, experts per token)]. Checkpoints of one shape (Llama 3.1 8B
# and Mistral 7B v0.3) are still two rows: each is its own published config.
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.1-8B-Instruct": _config(
        "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072
    ),
    "meta-llama/Llama-3.1-70B-Instruct": _config(
        "llama", 80, 8192, 64, 8, 128, 28672, 128256, 131072
    ),
    "Qwen/Qwen2.5-7B-Instruct": _config("qwen2", 28, 3584, 28, 4, None, 18944, 152064, 32768),
    "Qwen/Qwen3-32B": _config("qwen3", 64, 5120, 64, 8, 128, 25600, 151936, 40960),
    "mistralai/Mistral-7B-Instruct-v0.3": _config(
        "mistral", 32, 4096, 32, 8, 128, 14336, 32768, 32768
    ),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": _config(
        "mixtral", 32, 4096, 32, 8, None, 14336, 32000, 32768, experts=(8, 2)
    ),
}


def _gpu(
    name: str,
    model_name: str,
    total_mib: float,
    reserved_mib: float,
    tb_s: float,
    tflops: float,
    tdp: float,
    idle_w: float,
    idle_c: float,
    max_sm: int,
    idle_sm: int,
    mem_clock: int,
    thresholds: tuple[int, int] = (89, 95),
    nvlinks: int = 0,
) -> GPUSpec:
    return GPUSpec(
        name=name,
        model_name=model_name,
        total_bytes=int(total_mib * MIB),
        reserved_bytes=int(reserved_mib * MIB),
        bandwidth=tb_s * 1e12,
        bf16_flops=tflops * 1e12,
        tdp_watts=tdp,
        idle_watts=idle_w,
        idle_temp_c=idle_c,
        max_sm_clock_mhz=max_sm,
        idle_sm_clock_mhz=idle_sm,
        mem_clock_mhz=mem_clock,
        slowdown_temp_c=thresholds[0],
        shutdown_temp_c=thresholds[1],
        nvlinks=nvlinks,
    )


# Datasheet bandwidth and dense bf16 FLOP/s. Framebuffer totals are nvidia-smi's; the reserved
# part is measured where a capture exists (H200: the shared NVML recording, 615 MiB; L4: the
# dcgm-exporter capture, 470 MiB; H100: vLLM's "79.18 GiB" total in the llm-d logs) and about
# 500 MiB otherwise. Slowdown and shutdown temperatures: the H200's are the NVML recording's
# (89 and 95 C), the A100's an nvidia-smi -q of an A100 80GB (89 and 92 C); the others have
# no capture and take the H200's. NVLink: the SXM boards of an HGX baseboard (H100 SXM5 18
# links, A100 SXM4 12); the recorded H200 (a one-GPU VM) reports NVLink as not supported.
GPU_PRESETS: dict[str, GPUSpec] = {
    "H100": _gpu(
        "H100", "NVIDIA H100 80GB HBM3", 81559, 479, 3.35, 989.4, 700, 70, 32, 1980, 345, 2619,
        nvlinks=18,
    ),
    "H200": _gpu("H200", "NVIDIA H200", 143771.5, 615.06, 4.8, 989.4, 700, 78, 34, 1980, 345, 3201),
    "A100": _gpu(
        "A100", "NVIDIA A100-SXM4-80GB", 81920, 500, 2.039, 312, 400, 55, 30, 1410, 210, 1593,
        thresholds=(89, 92), nvlinks=12,
    ),
    "L40S": _gpu("L40S", "NVIDIA L40S", 46068, 500, 0.864, 362.05, 350, 32, 30, 2520, 210, 9001),
    "L4": _gpu("L4", "NVIDIA L4", 23033, 470, 0.3, 121, 72, 16, 31, 2040, 210, 6251),
}  # fmt: skip


def _find_preset(name: str, presets: dict[str, Any]) -> str | None:
    """Match a Hugging Face id, its last part, or that without "-Instruct[-vX.Y]"."""
    wanted = name.lower()
    for key in presets:
        last = key.split("/")[-1].lower()
        if wanted in (key.lower(), last, re.sub(r"-instruct(-v[\d.]+)?$", "", last)):
            return key
    return None


def gpu_preset(name: str) -> GPUSpec:
    key = _find_preset(name, GPU_PRESETS)
    if key is None:
        raise CapacityError(f"unknown GPU {name!r}; presets: {', '.join(GPU_PRESETS)}")
    return GPU_PRESETS[key]


def model_from_config(config: dict[str, Any], name: str) -> ModelSpec:
    """Read a Hugging Face config.json (multimodal configs: their text_config)."""
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)
    intermediate = config.get("moe_intermediate_size") if experts else None
    if not isinstance(intermediate, int):
        intermediate = config.get("intermediate_size")
    required = ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"]
    missing = [key for key in required if not isinstance(config.get(key), int)]
    if not isinstance(intermediate, int):
        missing.append("intermediate_size")
    if missing or not isinstance(intermediate, int):
        raise CapacityError(f"{name} does not describe a model: missing {', '.join(missing)}")
    heads = config["num_attention_heads"]
    model_type = str(config.get("model_type", ""))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return ModelSpec(
        name=name,
        layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        attention_heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        intermediate_size=intermediate,
        vocab_size=config["vocab_size"],
        dtype=normalize_dtype(dtype),
        # transformers' PretrainedConfig default is True
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        experts=experts,
        experts_per_token=int(config.get("num_experts_per_tok") or 0) if experts else 0,
        max_position_embeddings=int(config.get("max_position_embeddings") or 131072),
    )


def model_preset(name: str) -> ModelSpec:
    """A preset by its Hugging Face id or short name, or a config.json path (or its folder)."""
    key = _find_preset(name, MODEL_CONFIGS)
    if key is not None:
        return model_from_config(MODEL_CONFIGS[key], key)
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise CapacityError(
            f"{name!r} is neither a preset ({', '.join(MODEL_CONFIGS)}) nor a config.json file"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CapacityError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise CapacityError(f"{path} is not a JSON object")
    return model_from_config(config, str(config.get("_name_or_path") or path))
