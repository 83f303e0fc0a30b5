"""``inferwatch sim``: serve a simulated vLLM replica with a DCGM endpoint and fault injection."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import click

from inferwatch import config as layer
from inferwatch.capacity import planner as cap
from inferwatch.capacity.cli import serving_options
from inferwatch.clikit import BadInput, CannotRun, FiniteFloat, listen_error
from inferwatch.logs import log_event
from inferwatch.sim.faults import FaultError
from inferwatch.sim.server import serve_forever
from inferwatch.sim.simulator import SimConfig

logger = logging.getLogger("inferwatch.sim")


def _faults(path: Path | None) -> object:
    if path is None:
        return None
    try:
        return layer.load(path)
    except layer.ConfigError as exc:
        raise BadInput(f"fault file {exc}") from None


@click.command()
@serving_options
@click.option(
    "--served-model-name",
    "served_model_names",
    multiple=True,
    envvar="INFERWATCH_SIM_SERVED_MODEL_NAME",  # space-separated names
    show_envvar=True,
    help="A name the API answers to; repeat for more (vLLM takes them after one flag). "
    "Replies and metrics carry the first.  [default: the model's name]",
)
@click.option(
    "--engine-ranks",
    type=click.IntRange(1, 64),
    default=1,
    show_envvar=True,
    help="Data-parallel engine cores (values of the `engine` label).",
)
@click.option(
    "--num-gpu-blocks",
    type=click.IntRange(min=1),
    show_envvar=True,
    help="Override the KV cache size in blocks (small caches preempt sooner).",
)
@click.option(
    "--batching",
    type=click.Choice(["continuous", "static"]),
    default="continuous",
    show_envvar=True,
    help="static: a new batch starts only when the last one finished.",
)
@click.option(
    "--prefix-caching/--no-prefix-caching",
    default=True,
    show_envvar=True,
    help="Reuse the KV blocks of a shared prompt prefix (vLLM's automatic prefix caching).",
)
@click.option(
    "--speed",
    type=FiniteFloat(min=0.01),
    default=1.0,
    show_envvar=True,
    help="Simulated seconds per wall-clock second.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_envvar=True,
    help="Seed for the simulated answers and their lengths.",
)
@click.option(
    "--goldens",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    show_envvar=True,
    help="Folder of golden YAML files (default: the shipped set).",
)
@click.option(
    "--faults",
    "faults_file",
    envvar="INFERWATCH_SIM_FAULTS",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    show_envvar=True,
    help="YAML/JSON fault document applied at start-up.",
)
@click.option(
    "--admin-token",
    show_envvar=True,
    help="Bearer token for /admin/faults (the endpoint is off without one).",
)
@click.option(
    "--hostname",
    default="inferwatch-sim",
    show_envvar=True,
    help="Hostname label of the simulated GPUs.",
)
@click.option(
    "--storage-bandwidth",
    type=FiniteFloat(min=0),
    default=0.0,
    show_envvar=True,
    help="Cold start: GB/s at which the replica reads its weights (all GPUs together); /health "
    "and the completion routes answer 503 until the checkpoint is read. 0: loaded at once.",
)
@click.option(
    "--graph-capture-seconds",
    type=FiniteFloat(min=0),
    default=0.0,
    show_envvar=True,
    help="Cold start: simulated seconds the first engine step of each batch-size shape (vLLM's "
    "CUDA graph sizes 1, 2, 4, 8, 16, ...) costs on top; a warm-up at those sizes removes it.",
)
@click.option(
    "--num-speculative-tokens",
    type=click.IntRange(0, 16),
    default=0,
    show_envvar=True,
    help="Speculative decoding: draft tokens proposed per decode step (vLLM's "
    "num_speculative_tokens); /metrics then carries vllm:spec_decode_*. 0: off.",
)
@click.option(
    "--draft-acceptance",
    type=FiniteFloat(0.0, 1.0),
    default=0.8,
    show_envvar=True,
    help="Speculative decoding: the chance the draft's first token is accepted on an idle "
    "engine; deeper positions and a fuller batch accept less.",
)
@click.option("--host", default="127.0.0.1", show_envvar=True, help="Address to serve on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_envvar=True,
    help="0 picks a free port.",
)
@click.option(
    "--gpu-port",
    type=click.IntRange(0, 65535),
    show_envvar=True,
    help="Also serve the DCGM endpoint at /metrics on this port.",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    show_envvar=True,
    help="Once serving, write {url, gpu_url} as JSON here: the engine's base URL (for "
    "--engine-url, --upstream, --target) and its DCGM page (for --gpu dcgm=URL).",
)
def sim(
    model: str,
    served_model_names: tuple[str, ...],
    gpu: str,
    tensor_parallel: int,
    engine_ranks: int,
    gpu_memory_utilization: float,
    block_size: int,
    max_model_len: int | None,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    weight_dtype: str | None,
    kv_cache_dtype: str,
    num_gpu_blocks: int | None,
    batching: str,
    prefix_caching: bool,
    speed: float,
    seed: int,
    goldens: Path | None,
    faults_file: Path | None,
    admin_token: str | None,
    hostname: str,
    storage_bandwidth: float,
    graph_capture_seconds: float,
    num_speculative_tokens: int,
    draft_acceptance: float,
    host: str,
    port: int,
    gpu_port: int | None,
    ready_file: Path | None,
) -> None:
    """Serve a simulated vLLM replica (OpenAI API, /metrics, DCGM, faults) on one port."""
    config = SimConfig(
        model=model,
        served_model_names=served_model_names,
        gpu=gpu,
        tensor_parallel=tensor_parallel,
        engine_ranks=engine_ranks,
        gpu_memory_utilization=gpu_memory_utilization,
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        weight_dtype=weight_dtype,
        kv_cache_dtype=kv_cache_dtype,
        num_gpu_blocks=num_gpu_blocks,
        batching=batching,
        enable_prefix_caching=prefix_caching,
        speed=speed,
        seed=seed,
        goldens=goldens,
        faults=_faults(faults_file),  # type: ignore[arg-type]
        admin_token=admin_token,
        hostname=hostname,
        host=host,
        port=port,
        gpu_port=gpu_port,
        storage_bandwidth=storage_bandwidth * 1e9,
        graph_capture_seconds=graph_capture_seconds,
        num_speculative_tokens=num_speculative_tokens,
        draft_acceptance=draft_acceptance,
    )
    log_event(
        logger, logging.INFO, "simulator starting", model=model, gpu=gpu, host=host, port=port
    )
    try:
        serve_forever(config, ready_file)
    except (cap.CapacityError, FaultError) as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            ports = f"{port}" if gpu_port is None else f"{port} or {gpu_port}"
            raise listen_error(exc, f"{host}:{ports} (--port, --gpu-port)") from None
        raise CannotRun(str(exc)) from None
