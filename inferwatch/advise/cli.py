"""``inferwatch advise``: read a model's last window from Prometheus and propose the engine
settings and replica count that meet its SLO with the fewest GPUs."""

from __future__ import annotations

import json
import time

import click

from inferwatch.advise import plan as planning
from inferwatch.advise import render, rules
from inferwatch.advise.proposals import proposals
from inferwatch.advise.window import Window, read
from inferwatch.canary.prometheus import Prometheus, PrometheusError
from inferwatch.capacity import planner as cap
from inferwatch.capacity.cli import tensor_parallel_option
from inferwatch.clikit import (
    BadInput,
    CannotRun,
    Failed,
    FiniteFloat,
    json_option,
    prometheus_option,
)
from inferwatch.config import Duration, DurationParam
from inferwatch.mixin import config as alert_config
from inferwatch.serving.prometheus_api import timeout_option


def _gpu(window: Window, name: str | None) -> cap.GPUSpec:
    """The GPU preset given, else the one whose product name the replicas report."""
    try:
        if name is not None:
            return cap.gpu_preset(name)
    except cap.CapacityError as exc:
        raise BadInput(str(exc)) from None
    for spec in cap.GPU_PRESETS.values():
        if window.gpu_name and window.gpu_name == spec.model_name:
            return spec
    seen = f"they report {window.gpu_name!r}" if window.gpu_name else "they report none"
    raise BadInput(f"no GPU preset matches the GPUs of {window.model} ({seen}): give --gpu")


@click.command()
@prometheus_option()
@click.option(
    "--model", required=True, show_envvar=True, help="The model label of the replicas to advise."
)
@click.option(
    "--engine-model",
    show_envvar=True,
    help="The capacity model's preset or config.json of the model's weights (default: --model).",
)
@click.option(
    "--gpu",
    show_envvar=True,
    help="GPU preset (" + ", ".join(cap.GPU_PRESETS) + "); default: the one the replicas report.",
)
@tensor_parallel_option
@click.option(
    "--slo-ttft",
    type=FiniteFloat(min=0, min_open=True),
    show_envvar=True,
    help="Time to first token to meet, in seconds.  [default: the alert config's SLO threshold]",
)
@click.option(
    "--slo-tpot",
    type=FiniteFloat(min=0, min_open=True),
    show_envvar=True,
    help="Time per output token to meet, in seconds.  [default: none]",
)
@click.option(
    "--window",
    type=DurationParam(Duration.of_seconds(60), Duration.of_seconds(86400)),
    default="10m",
    show_envvar=True,
    help="How much recent data to read (1m to 1d).",
)
@click.option(
    "--min-requests",
    type=click.IntRange(min=1),
    default=rules.MIN_REQUESTS,
    show_envvar=True,
    help="Finished requests the window must hold; fewer: no advice (exit 2).",
)
@click.option(
    "--headroom",
    type=FiniteFloat(0, 1, min_open=True),
    default=planning.HEADROOM,
    show_envvar=True,
    help="Share of each SLO the capacity model's steady-state mean must stay under (leaves "
    "the tail room).",
)
@timeout_option("Seconds all queries to Prometheus may take together.")
@json_option("advise")
def advise(
    prometheus: str,
    model: str,
    engine_model: str | None,
    gpu: str | None,
    tensor_parallel: int,
    slo_ttft: float | None,
    slo_tpot: float | None,
    window: Duration,
    min_requests: int,
    headroom: float,
    timeout: float,
    as_json: bool,
) -> None:
    """Propose engine settings (vLLM's --max-num-seqs, --max-num-batched-tokens,
    --gpu-memory-utilization, --max-model-len, or SGLang's and TGI's equivalents) and the
    replica count that meet the SLO with the fewest GPUs, from the model's last --window in
    Prometheus and the capacity model; each with the series and values it read.

    Exit 2 (one line) when the window holds too little traffic or the engine does not export
    a signal the load is measured by; 1 when no setting meets the SLO; 3 when Prometheus
    cannot be read.
    """
    try:
        client = Prometheus(prometheus, deadline_s=timeout)
    except PrometheusError as exc:
        raise BadInput(str(exc)) from None
    try:
        with client:
            seen = read(client, model, window, time.time())
    except PrometheusError as exc:
        raise CannotRun(str(exc)) from None
    refused = rules.refusal(seen, min_requests)
    if refused is not None:
        raise BadInput(f"no advice: {refused}")
    try:
        spec = cap.model_preset(engine_model or model)
    except cap.CapacityError as exc:
        raise BadInput(f"{exc} (--engine-model)") from None
    ttft = (
        slo_ttft
        if slo_ttft is not None
        else float(alert_config.defaults()["slo"]["ttft"]["threshold"])
    )
    slo = planning.Objectives(ttft, slo_tpot)
    try:
        chosen = planning.plan(seen, spec, _gpu(seen, gpu), tensor_parallel, slo, headroom)
    except planning.Unmeetable as exc:
        raise Failed(f"no setting meets the SLO: {exc}") from None
    except cap.CapacityError as exc:
        raise BadInput(str(exc)) from None
    made = proposals(seen, chosen)
    if as_json:
        click.echo(json.dumps(render.document(seen, chosen, slo, made), indent=2))
    else:
        click.echo(render.table(seen, chosen, slo, made))
