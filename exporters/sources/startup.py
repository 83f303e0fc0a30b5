"""The start-up source: the replica's cold-start phases, with the warm-up gate when planned."""

from __future__ import annotations

from functools import partial

import click

from inferwatch.clikit import FiniteFloat
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.registry import Built, Registration, Setup
from inferwatch.exporters.startup.phases import StartupTracker
from inferwatch.exporters.startup.warmup import Warmup, WarmupPlan
from inferwatch.probes.runner import ProbeRunner

#: the largest warm-up batch (vLLM captures CUDA graphs up to 512) and prompt
MAX_WARMUP_BATCH = 1024
MAX_WARMUP_PROMPT = 131072


def int_list(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    """``1,8,32`` -> (1, 8, 32); every item a positive integer."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not all(item.isascii() and item.isdigit() and int(item) > 0 for item in items):
        raise click.BadParameter(f"{value!r} is not a comma-separated list of positive integers")
    return tuple(int(item) for item in items)


def build(setup: Setup) -> Built | None:
    """The tracker of the engine's start-up; the probe loop waits for its warm-up, and the
    probes' own requests are subtracted from the engine's to find the first client's."""
    options = setup.options
    engine = setup.source("engine", EngineCollector)
    if engine is None:
        if options["warmup_batch_sizes"]:
            raise click.UsageError("--warmup-batch-sizes needs --engine-url: warm-up goes to it")
        return None
    warmup = None
    if options["warmup_batch_sizes"]:
        plan = _warmup_plan(
            options["warmup_batch_sizes"],
            options["warmup_prompt_tokens"],
            options["warmup_max_tokens"],
            options["warmup_deadline"],
        )
        warmup = Warmup(plan, engine.base_url, setup.identity["model"])
    runner = setup.source("probes", ProbeRunner)
    probes_sent = (lambda: sum(runner.metrics.runs.values())) if runner else (lambda: 0)
    tracker = StartupTracker(engine, warmup, own_requests=probes_sent)
    background = [tracker.run]
    if runner is not None:  # a replica still loading or warming up says nothing of quality
        background.append(partial(tracker.after_warmup, runner.run))
    return Built([tracker], background)


def _warmup_plan(
    batch_sizes: tuple[int, ...], prompt_tokens: tuple[int, ...], max_tokens: int, deadline: float
) -> WarmupPlan:
    if max(batch_sizes) > MAX_WARMUP_BATCH:
        raise click.BadParameter(
            f"a warm-up batch is at most {MAX_WARMUP_BATCH} requests",
            param_hint="--warmup-batch-sizes",
        )
    if not prompt_tokens or max(prompt_tokens) > MAX_WARMUP_PROMPT:
        raise click.BadParameter(
            f"give one to a few prompt lengths of at most {MAX_WARMUP_PROMPT} tokens",
            param_hint="--warmup-prompt-tokens",
        )
    return WarmupPlan(batch_sizes, prompt_tokens, max_tokens, deadline)


REGISTRATION = Registration(
    "startup",
    options=[
        click.option(
            "--warmup-batch-sizes",
            default="",
            callback=int_list,
            show_envvar=True,
            help="Warm-up gate: batch sizes (comma-separated, e.g. 1,8,32) at which the sidecar "
            "sends warm-up requests to the engine's /v1/completions once it is healthy, each "
            "batch at once, before /readyz may turn ready (readiness condition warmup). Empty "
            "(the default): no warm-up, the replica is ready as soon as the engine is.",
        ),
        click.option(
            "--warmup-prompt-tokens",
            default="16,1024",
            callback=int_list,
            show_envvar=True,
            show_default=True,
            help="Prompt lengths (about one token per word) sent at every warm-up batch size: a "
            "short one and a long one that allocates KV cache. Each must fit the model's context.",
        ),
        click.option(
            "--warmup-max-tokens",
            type=click.IntRange(1, 64),
            default=4,
            show_envvar=True,
            show_default=True,
            help="max_tokens of each warm-up request.",
        ),
        click.option(
            "--warmup-deadline",
            type=FiniteFloat(min=1),
            default=120.0,
            show_envvar=True,
            show_default=True,
            help="Seconds one warm-up round may take; a round that fails or overruns keeps the "
            "replica unready with the reason, and is retried with backoff (2s doubling to 60s).",
        ),
    ],
    build=build,
)
