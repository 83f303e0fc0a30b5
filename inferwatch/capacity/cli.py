"""``inferwatch capacity``: print how a model fits a GPU under vLLM-style serving settings,
and with ``--rate``, how many replicas serve that load within a TTFT/TPOT SLO."""

from __future__ import annotations

import json
from dataclasses import replace

import click

from inferwatch.capacity import planner as cap
from inferwatch.capacity import sizing
from inferwatch.clikit import BadInput, FiniteFloat, json_option, option_group
from inferwatch.exitcodes import ExitCode


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


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def _at(estimate: sizing.Estimate, slo: sizing.SLO) -> str:
    if estimate.overloaded is not None:
        return f"overloaded: {estimate.overloaded}"
    text = (
        f"TTFT {_ms(estimate.ttft)}, TPOT {_ms(estimate.tpot)}, "
        f"{estimate.running:,} sequences decoding "
        f"({estimate.rate_per_replica:,.3g} requests/s each)"
    )
    missed = [
        name
        for name, objective, value in (("TTFT", slo.ttft, estimate.ttft),
                                       ("TPOT", slo.tpot, estimate.tpot))
        if objective is not None and value > objective
    ]  # fmt: skip
    return text + (f"; misses the {' and '.join(missed)} SLO" if missed else "")


def render_sizing(
    workload: sizing.Workload,
    slo: sizing.SLO,
    needed: sizing.Estimate,
    fewer: sizing.Estimate | None,
    best: sizing.Estimate,
) -> str:
    """Replicas for the load, the estimate there and at one fewer, and the floors."""
    objectives = [
        f"{name} <= {_ms(value)}"
        for name, value in (("TTFT", slo.ttft), ("TPOT", slo.tpot))
        if value is not None
    ]
    rows = [
        ("load", f"{workload.rate:,.6g} requests/s of {workload.prompt_tokens:,} prompt + "
                 f"{workload.completion_tokens:,} completion tokens"),
        ("SLO", ", ".join(objectives) + " (steady-state means)" if objectives
                else "none: keep up with the load"),
        ("replicas needed", f"{needed.replicas:,}"),
        (f"at {needed.replicas:,}", _at(needed, slo)),
    ]  # fmt: skip
    if fewer is not None:
        rows.append((f"at {fewer.replicas:,}", _at(fewer, slo)))
    rows.append(("floors", f"TTFT {_ms(best.ttft)}, TPOT {_ms(best.tpot)} (a request alone)"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _estimate_dict(estimate: sizing.Estimate) -> dict[str, object]:
    overloaded = estimate.overloaded is not None
    return {
        "replicas": estimate.replicas,
        "rate_per_replica": estimate.rate_per_replica,
        "running": estimate.running,
        "ttft_seconds": None if overloaded else estimate.ttft,
        "tpot_seconds": None if overloaded else estimate.tpot,
        "overloaded": estimate.overloaded,
    }


#: ``--tensor-parallel``: of the replicas `capacity` sizes, `sim` serves and `advise` plans for.
tensor_parallel_option = click.option(
    "--tensor-parallel",
    "-tp",
    type=click.IntRange(min=1),
    default=1,
    show_envvar=True,
    help="GPUs each replica splits the model over (vLLM --tensor-parallel-size).",
)

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
    tensor_parallel_option,
    click.option(
        "--gpu-memory-utilization",
        type=FiniteFloat(0, 1, min_open=True),
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
    type=FiniteFloat(min=0, min_open=True),
    show_envvar=True,
    help="Override the GPU's usable memory (what CUDA reports as total).",
)
@click.option(
    "--reserve-gib",
    type=FiniteFloat(min=0),
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
    "--rate",
    type=FiniteFloat(min=0),
    show_envvar=True,
    help="Requests per second for the whole fleet: print the replicas that serve it "
    "(needs --prompt-tokens and --completion-tokens).",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=1),
    show_envvar=True,
    help="Prompt length of the --rate requests, in tokens.",
)
@click.option(
    "--completion-tokens",
    type=click.IntRange(min=1),
    show_envvar=True,
    help="Completion length of the --rate requests, in tokens.",
)
@click.option(
    "--ttft-slo",
    type=FiniteFloat(min=0, min_open=True),
    show_envvar=True,
    help="Mean time to first token to stay under, in seconds (with --rate).",
)
@click.option(
    "--tpot-slo",
    type=FiniteFloat(min=0, min_open=True),
    show_envvar=True,
    help="Mean time per output token to stay under, in seconds (with --rate).",
)
@json_option("capacity")
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
    rate: float | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    ttft_slo: float | None,
    tpot_slo: float | None,
    as_json: bool,
) -> None:
    """Weights, KV cache, blocks and concurrency of a model on a GPU (vLLM's accounting).

    A configuration that cannot start still gets its table, then the reason and the flag
    changes under which it would start, and exit code 1.

    With --rate, --prompt-tokens and --completion-tokens it also answers the inverse: the
    fewest replicas that keep up with that load and meet --ttft-slo and --tpot-slo, from the
    steady state of the simulator's scheduler limits and roofline. An SLO no replica count
    meets (below the single-request floor) is an error that names the floor.
    """
    workload = _workload(rate, prompt_tokens, completion_tokens, ttft_slo, tpot_slo)
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
        raise BadInput(str(exc)) from None
    context = context or result.max_model_len
    problem = result.problem
    suggestions = [] if problem is None else cap.suggest(model_spec, gpu_spec, serving)
    slo = sizing.SLO(ttft=ttft_slo, tpot=tpot_slo)
    sized: tuple[sizing.Estimate, sizing.Estimate | None, sizing.Estimate] | None = None
    if workload is not None and problem is None:
        try:
            needed = sizing.replicas_for(result, workload, slo)
            fewer = None
            if needed.replicas > 1:
                fewer = sizing.estimate(result, workload, needed.replicas - 1)
            sized = needed, fewer, sizing.floors(result, workload)
        except cap.CapacityError as exc:
            raise BadInput(str(exc)) from None
    if as_json:
        document = result.to_dict(context)
        if problem is not None:
            document["suggestions"] = [suggestion.flags for suggestion in suggestions]
        if sized is not None:
            needed, fewer, best = sized
            document["sizing"] = {
                "rate": workload.rate if workload else None,
                "ttft_slo_seconds": ttft_slo,
                "tpot_slo_seconds": tpot_slo,
                "replicas": needed.replicas,
                "at_replicas": _estimate_dict(needed),
                "at_one_fewer": None if fewer is None else _estimate_dict(fewer),
                "floor_ttft_seconds": best.ttft,
                "floor_tpot_seconds": best.tpot,
            }
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(render_table(result, context))
        if problem is not None:
            click.echo(render_problem(problem, suggestions))
        if sized is not None and workload is not None:
            click.echo("")
            click.echo(render_sizing(workload, slo, *sized))
    if problem is not None:
        raise click.exceptions.Exit(ExitCode.FAILED)


def _workload(
    rate: float | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    ttft_slo: float | None,
    tpot_slo: float | None,
) -> sizing.Workload | None:
    """The load to size for, or None; flags that only make sense together are checked here."""
    if rate is None:
        given = [name for name, value in (("--prompt-tokens", prompt_tokens),
                                          ("--completion-tokens", completion_tokens),
                                          ("--ttft-slo", ttft_slo), ("--tpot-slo", tpot_slo))
                 if value is not None]  # fmt: skip
        if given:
            raise BadInput(f"{given[0]} sizes replicas for a load: give --rate too")
        return None
    if prompt_tokens is None or completion_tokens is None:
        raise BadInput("--rate needs --prompt-tokens and --completion-tokens")
    return sizing.Workload(rate, prompt_tokens, completion_tokens)
