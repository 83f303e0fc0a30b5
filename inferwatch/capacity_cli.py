"""``inferwatch capacity``: print how a model fits a GPU under vLLM-style serving settings."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import click

from inferwatch import capacity as cap
from inferwatch.clikit import option_group


def _gib(value: float) -> str:
    return f"{value / cap.GIB:,.2f} GiB"


def render_table(result: cap.Capacity, context: int) -> str:
    """A two-column summary for a terminal."""
    model, gpu, serving = result.model, result.gpu, result.serving
    params = f"{model.params / 1e9:.2f} B parameters"
    if model.experts:
        params += f", {model.active_params / 1e9:.2f} B active ({model.experts} experts)"
    per_token = result.kv_bytes_per_token_per_gpu
    sequences = result.max_sequences(context)
    utilization = serving.gpu_memory_utilization
    limits = (
        f"max_num_seqs {result.max_num_seqs}, "
        f"max_num_batched_tokens {result.max_num_batched_tokens}"
    )
    rows = [
        ("model", f"{model.name} ({params})"),
        ("gpu", f"{gpu.name} x{serving.tensor_parallel}, {_gib(gpu.memory_bytes)} usable each"),
        ("dtypes", f"weights {result.weight_dtype}, KV cache {result.kv_cache_dtype}"),
        ("budget", f"{_gib(result.budget_bytes)} per GPU (gpu-memory-utilization {utilization})"),
        ("weights", f"{_gib(result.weight_bytes)} per GPU"),
        ("activation reserve", f"{_gib(result.reserve_bytes)} per GPU ({limits})"),
        ("KV cache", f"{_gib(result.kv_bytes)} per GPU" if result.kv_bytes > 0
                     else f"none ({_gib(-result.kv_bytes)} short per GPU)"),
        ("KV bytes per token", f"{result.kv_bytes_per_token:,} (model), {per_token:,} per GPU"),
        ("KV blocks", f"{result.num_blocks:,} x {result.block_size} = {result.kv_tokens:,} tokens"),
        ("max concurrency", f"{result.max_concurrency(context):,.2f}x at {context:,} tokens"),
        ("preemption from", f"sequence {sequences + 1} of {context:,} tokens"),
        ("longest sequence", f"{result.longest_sequence:,} tokens fit in the KV cache"),
        ("start-up needs", _start_up_needs(result)),
    ]  # fmt: skip
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _start_up_needs(result: cap.Capacity) -> str:
    needed = result.min_gpu_memory_utilization
    at = f"at max-model-len {result.max_model_len:,}"
    if needed <= 1:
        return f"gpu-memory-utilization >= {needed:.2f} {at}"
    return f"{_gib(needed * result.gpu.memory_bytes)} per GPU {at}, more than the GPU has"


def render_problem(problem: str, suggestions: list[cap.Suggestion]) -> str:
    """What does not fit and the flag changes under which it would."""
    lines = [f"does not fit: {problem}"]
    if suggestions:
        lines.append("it would start with any one of:")
        lines += [f"  {suggestion.flags}" for suggestion in suggestions]
    else:
        lines.append("no change of one or two serving flags makes it fit; pick a larger GPU")
    return "\n".join(lines)


#: Model, GPU and vLLM serving settings: what `capacity` computes from and `sim` serves with.
serving_options = option_group(
    click.option(
        "--model",
        default="meta-llama/Llama-3.1-8B-Instruct",
        show_envvar=True,
        help="Preset (" + ", ".join(cap.MODEL_CONFIGS) + ") or a config.json path/folder.",
    ),
    click.option(
        "--gpu",
        default="H100",
        show_envvar=True,
        help="GPU preset: " + ", ".join(cap.GPU_PRESETS) + ".",
    ),
    click.option(
        "--tensor-parallel",
        "-tp",
        type=click.IntRange(min=1),
        default=1,
        show_envvar=True,
        help="GPUs the model is split over (vLLM --tensor-parallel-size).",
    ),
    click.option(
        "--gpu-memory-utilization",
        type=click.FloatRange(0, 1, min_open=True),
        default=0.92,
        show_envvar=True,
        help="Share of each GPU's memory the engine may take (weights, activations, KV cache).",
    ),
    click.option(
        "--block-size",
        type=click.IntRange(min=1),
        default=16,
        show_envvar=True,
        help="Tokens per KV cache block.",
    ),
    click.option(
        "--max-model-len",
        type=click.IntRange(min=1),
        show_envvar=True,
        help="Default: the model's max_position_embeddings.",
    ),
    click.option(
        "--weight-dtype",
        type=click.Choice(sorted(cap.DTYPE_BYTES)),
        show_envvar=True,
        help="Default: the model's dtype; fp8/int8/int4 for quantized checkpoints.",
    ),
    click.option(
        "--kv-cache-dtype",
        type=click.Choice(["auto", "bf16", "fp16", "fp8"]),
        default="auto",
        show_envvar=True,
        help="auto: the model's dtype; fp8 halves the KV cache's bytes per token.",
    ),
    click.option(
        "--max-num-seqs",
        type=click.IntRange(min=1),
        show_envvar=True,
        help="Default: vLLM's (1024 on >=70 GiB GPUs other than A100, else 256).",
    ),
    click.option(
        "--max-num-batched-tokens",
        type=click.IntRange(min=1),
        show_envvar=True,
        help="Default: vLLM's (8192 on >=70 GiB GPUs other than A100, else 2048).",
    ),
)


@click.command()
@serving_options
@click.option(
    "--gpu-memory-gib",
    type=click.FloatRange(min=0, min_open=True),
    show_envvar=True,
    help="Override the GPU's usable memory (what CUDA reports as total).",
)
@click.option(
    "--reserve-gib",
    type=click.FloatRange(min=0),
    show_envvar=True,
    help="Override the activation/overhead reserve estimate.",
)
@click.option(
    "--context",
    type=click.IntRange(min=1),
    show_envvar=True,
    help="Tokens per sequence for the concurrency figures (default: max-model-len).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    envvar="INFERWATCH_CAPACITY_JSON",
    show_envvar=True,
    help="Print JSON instead of a table.",
)
def capacity(
    model: str,
    gpu: str,
    gpu_memory_gib: float | None,
    tensor_parallel: int,
    gpu_memory_utilization: float,
    block_size: int,
    max_model_len: int | None,
    weight_dtype: str | None,
    kv_cache_dtype: str,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    reserve_gib: float | None,
    context: int | None,
    as_json: bool,
) -> None:
    """Weights, KV cache, blocks and concurrency of a model on a GPU (vLLM's accounting).

    A configuration that cannot start still gets its table, then the reason and the flag
    changes under which it would start, and exit code 1.
    """
    try:
        model_spec = cap.model_preset(model)
        gpu_spec = cap.gpu_preset(gpu)
        if gpu_memory_gib is not None:
            total_bytes = int(gpu_memory_gib * cap.GIB) + gpu_spec.reserved_bytes
            gpu_spec = replace(gpu_spec, total_bytes=total_bytes)
        serving = cap.ServingSpec(
            tensor_parallel=tensor_parallel,
            gpu_memory_utilization=gpu_memory_utilization,
            block_size=block_size,
            max_model_len=max_model_len,
            weight_dtype=weight_dtype,
            kv_cache_dtype=kv_cache_dtype,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            reserve_bytes=None if reserve_gib is None else int(reserve_gib * cap.GIB),
        )
        result = cap.size(model_spec, gpu_spec, serving)
    except cap.CapacityError as exc:
        raise click.ClickException(str(exc)) from None
    context = context or result.max_model_len
    problem = result.problem
    suggestions = [] if problem is None else cap.suggest(model_spec, gpu_spec, serving)
    if as_json:
        document = result.to_dict(context)
        if problem is not None:
            document["suggestions"] = [suggestion.flags for suggestion in suggestions]
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(render_table(result, context))
        if problem is not None:
            click.echo(render_problem(problem, suggestions))
    if problem is not None:
        sys.exit(1)
