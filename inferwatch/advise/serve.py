"""``inferwatch advisor``: the advice of ``inferwatch advise``, evaluated every ``--every`` for
each model and served as series, so that a board can set it beside the settings the replicas
run with (``inferwatch_engine_setting``) and an alert can watch it.

Each evaluation is :func:`inferwatch.advise.evaluate.evaluate`, the one the command runs. A
failed one (too little traffic, Prometheus away, no setting meets the SLO, even a bug) is
counted by outcome and logged when the outcome changes; the last advice stays served, its
age told by ``inferwatch_advise_last_success_timestamp_seconds``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import click
from prometheus_client.core import Metric
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.routing import Route

from inferwatch import catalog
from inferwatch.advise import cli as advise_cli
from inferwatch.advise.evaluate import OUTCOMES, Advice, Refused, Request, evaluate, objectives
from inferwatch.canary.prometheus import Prometheus, PrometheusError
from inferwatch.clikit import BadInput, bind, listen_option, parse_listen
from inferwatch.config import Duration, DurationParam
from inferwatch.logs import log_event
from inferwatch.serving import endpoints, uvicorn_server
from inferwatch.serving.readiness import Condition

logger = logging.getLogger("inferwatch.advisor")

#: the outcome of an evaluation that raised what no rule expects (an inferwatch bug)
INTERNAL = "internal"


class Advisor:
    """The last advice and the evaluation counts of each model; ``evaluate_all`` runs a pass
    (blocking: it queries Prometheus), ``families`` serves them."""

    def __init__(
        self,
        prometheus: str,
        requests: Sequence[Request],
        timeout_s: float,
        clock: Callable[[], float] = time.time,
    ):
        self.prometheus = prometheus
        self.requests = tuple(requests)
        self.timeout_s = timeout_s
        self.clock = clock
        self.runs: Counter[tuple[str, str]] = Counter()
        self.advice: dict[str, Advice] = {}
        self.last_success: dict[str, float] = {}
        self.last_outcome: dict[str, str] = {}
        self.passes = 0

    def evaluate_all(self) -> None:
        for request in self.requests:
            self.evaluate(request)
        self.passes += 1

    def evaluate(self, request: Request) -> str:
        """Evaluate one model's advice now; its outcome, counted and logged on change."""
        now = self.clock()
        detail = ""
        try:
            advice = evaluate(Prometheus(self.prometheus, deadline_s=self.timeout_s), request, now)
        except Refused as refused:
            outcome, detail = refused.outcome, str(refused)
        except PrometheusError as exc:  # the URL: checked at start, so not expected here
            outcome, detail = "prometheus_error", str(exc)
        except Exception as exc:  # a bug must not end the advice of every model
            logger.exception("advice evaluation failed")
            outcome, detail = INTERNAL, f"{type(exc).__name__}: {exc}"
        else:
            outcome = "advised"
            self.advice[request.model] = advice
            self.last_success[request.model] = now
        self.runs[request.model, outcome] += 1
        if self.last_outcome.get(request.model) != outcome:
            level = logging.INFO if outcome == "advised" else logging.WARNING
            log_event(logger, level, "advice " + outcome, model=request.model, detail=detail)
        self.last_outcome[request.model] = outcome
        return outcome

    def families(self) -> list[Metric]:
        cat = catalog.load()
        setting, replicas = cat.family("advise_setting"), cat.family("advise_replicas")
        runs, success = cat.family("advise_runs"), cat.family("advise_last_success")
        for request in self.requests:
            model = request.model
            for outcome in (*OUTCOMES, INTERNAL):  # every series from the start: rate() works
                runs.add_metric([model, outcome], self.runs[model, outcome])
            advice = self.advice.get(model)
            if advice is None:
                continue
            for proposal in advice.proposals:
                if proposal.setting == "replicas":
                    replicas.add_metric([model], proposal.value)
                else:
                    setting.add_metric([model, proposal.setting], proposal.value)
            success.add_metric([model], self.last_success[model])
        return [setting, replicas, runs, success]

    def readiness(self) -> list[Condition]:
        done = self.passes > 0
        return [Condition("evaluated", done, "" if done else "the first evaluation is running")]


def app(advisor: Advisor, every_s: float) -> Starlette:
    """/metrics, /healthz and /readyz, with a pass over the models every ``every_s`` seconds
    (in a worker thread: the queries block) from start to shutdown."""

    async def loop() -> None:
        while True:
            await asyncio.to_thread(advisor.evaluate_all)
            await asyncio.sleep(every_s)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        job = asyncio.create_task(loop())
        yield
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    async def metrics(request: HTTPRequest) -> Response:
        return endpoints.metrics_response(request, advisor.families())

    async def readyz(request: HTTPRequest) -> Response:
        return endpoints.readiness_response(advisor.readiness())

    return Starlette(
        routes=[
            Route("/metrics", metrics),
            Route("/healthz", endpoints.healthz),
            Route("/readyz", readyz),
        ],
        lifespan=lifespan,
    )


#: the options of ``inferwatch advise`` the advisor takes as they are (``--engine-model`` is
#: each ``--model``'s ``=PRESET``)
SHARED = (
    "prometheus",
    "gpu",
    "tensor_parallel",
    "slo_ttft",
    "slo_tpot",
    "window",
    "min_requests",
    "headroom",
    "timeout",
)


@click.command()
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    envvar="INFERWATCH_ADVISOR_MODEL",
    show_envvar=True,
    metavar="MODEL[=PRESET]",
    help="A model label to advise, with the capacity model's preset or config.json of its "
    "weights after = (default: the label); repeatable.",
)
@click.option(
    "--every",
    type=DurationParam(Duration.of_seconds(10), Duration.of_seconds(86400)),
    default="5m",
    show_envvar=True,
    help="How often each model's advice is evaluated (10s to 1d).",
)
@listen_option(":9407")
@uvicorn_server.limit_options
def advisor(models: tuple[str, ...], every: Duration, listen: str, **options: Any) -> None:
    """Evaluate inferwatch advise for each --model every --every and serve the advice on
    /metrics (inferwatch_advise_setting, inferwatch_advise_replicas), with the outcome of
    each evaluation (inferwatch_advise_runs_total) and the time of the last that advised.
    A failed evaluation is counted and the last advice stays served."""
    host, port = parse_listen(listen)
    prometheus, timeout = options.pop("prometheus"), options.pop("timeout")
    try:
        Prometheus(prometheus).close()
    except PrometheusError as exc:
        raise BadInput(str(exc)) from None
    slo = objectives(options.pop("slo_ttft"), options.pop("slo_tpot"))
    requests: list[Request] = []
    for given in models:
        model, _, preset = given.partition("=")
        if not model:
            raise click.BadParameter(f"{given!r} names no model", param_hint="--model")
        if any(request.model == model for request in requests):
            raise click.BadParameter(f"{model!r} is given twice", param_hint="--model")
        requests.append(
            Request(
                model,
                preset or None,
                options["gpu"],
                options["tensor_parallel"],
                slo,
                options["window"],
                options["min_requests"],
                options["headroom"],
            )
        )
    advisor = Advisor(prometheus, requests, timeout)
    sock = bind((host, port))
    log_event(
        logger,
        logging.INFO,
        "advisor starting",
        listen="{}:{}".format(*sock.getsockname()[:2]),
        models=len(requests),
        every=str(every),
    )
    limits = uvicorn_server.limits_from(options)
    uvicorn_server.serve(app(advisor, every.seconds), sock, limits)


def _shared(param: click.Parameter) -> click.Parameter:
    """An option of ``inferwatch advise``, for the advisor (which exits for no refusal)."""
    shared = copy.copy(param)
    if shared.name == "min_requests" and isinstance(shared, click.Option):
        shared.help = "Finished requests the window must hold; fewer: no advice (outcome "
        shared.help += "too_little_traffic)."
    return shared


advisor.params.extend(_shared(p) for p in advise_cli.advise.params if p.name in SHARED)
