"""How long one engine step takes on the simulated GPU: a roofline of bytes moved and FLOPs.

step = max(bytes read / achieved bandwidth, FLOPs / achieved FLOP/s) + fixed overhead

Bytes are the weights (for a mixture of experts, only the experts the step's tokens touch)
plus the KV cache every sequence attends over; FLOPs are 2 per active parameter per token plus
attention over the context. Decode steps come out memory-bound (time per output token barely
grows with batch size), prefill steps compute-bound, as on real GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferwatch.capacity.planner import DTYPE_BYTES, Capacity

# Fractions of the datasheet peaks that serving kernels reach in practice.
BANDWIDTH_EFFICIENCY = 0.8
COMPUTE_EFFICIENCY = 0.55
# Scheduling, sampling and kernel launches per step (CUDA graphs keep this small).
STEP_OVERHEAD_S = 0.002
# One all-reduce per attention and per MLP block per layer under tensor parallelism.
ALLREDUCE_S = 8e-6


@dataclass(frozen=True)
class StepCost:
    seconds: float
    compute_share: float  # how compute-bound the step was, 0..1 (drives power and clocks)


@dataclass(frozen=True)
class Roofline:
    capacity: Capacity

    def step(self, items: Sequence[tuple[int, int]]) -> StepCost:
        """Cost of a step; ``items`` are (new tokens, context after the step) per sequence."""
        tokens = sum(new for new, _ in items)
        if tokens == 0:
            return StepCost(0.0, 0.0)
        cap = self.capacity
        model, gpu, tp = cap.model, cap.gpu, cap.serving.tensor_parallel
        expert_bytes = model.expert_params * DTYPE_BYTES[cap.weight_dtype] / tp
        weight_bytes = cap.weight_bytes - expert_bytes
        if model.experts:
            untouched = (1 - model.experts_per_token / model.experts) ** tokens
            weight_bytes += expert_bytes * (1 - untouched)
        kv_read = sum(context for _, context in items) * cap.kv_bytes_per_token_per_gpu
        moved = weight_bytes + kv_read + tokens * cap.kv_bytes_per_token_per_gpu
        attention = sum(new * (context - new / 2) for new, context in items)
        heads = model.attention_heads // tp
        flops = 2 * model.active_params / tp * tokens
        flops += 4 * model.layers * heads * model.head_dim * attention
        memory_s = moved / (gpu.bandwidth * BANDWIDTH_EFFICIENCY)
        compute_s = flops / (gpu.bf16_flops * COMPUTE_EFFICIENCY)
        overhead = STEP_OVERHEAD_S + (2 * model.layers * ALLREDUCE_S if tp > 1 else 0.0)
        return StepCost(max(memory_s, compute_s) + overhead, compute_s / (compute_s + memory_s))
