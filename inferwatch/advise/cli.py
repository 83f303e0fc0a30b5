"""``inferwatch advise``: read a model's last window from Prometheus and propose the engine
settings and replica count that meet its SLO with the fewest GPUs."""

from __future__ import annotations

import json
import time

import click

from inferwatch.advise import plan as planning
from inferwatch.advise import render, rules
from inferwatch.advise.evaluate import Refused, Request, evaluate, objectives
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
from inferwatch.serving.prometheus_api import timeout_option

#: how each refusal ends the command (the rest are bad input, exit 2)
_EXITS: dict[str, type[click.ClickException]] = {
    "prometheus_error": CannotRun,
    "no_setting_meets": Failed,
}


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
    slo = objectives(slo_ttft, slo_tpot)
    request = Request(
        model, engine_model, gpu, tensor_parallel, slo, window, min_requests, headroom
    )
    try:
        advice = evaluate(client, request, time.time())
    except Refused as refused:
        raise _EXITS.get(refused.outcome, BadInput)(str(refused)) from None
    seen, chosen, made = advice.window, advice.plan, advice.proposals
    if as_json:
        click.echo(json.dumps(render.document(seen, chosen, slo, made), indent=2))
    else:
        click.echo(render.table(seen, chosen, slo, made))
