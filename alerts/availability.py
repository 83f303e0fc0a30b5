"""Availability layer: engine and sidecar down, scrape errors, error ratio, readiness.

Readiness reads ``inferwatch_replica_ready``, the sidecar's /readyz conditions as series:
one replica out is a warning (the router already routes around it), more than a configured
share of a model's replicas out pages. A gateway that fails open (no ready replica of the model
or of its fallback) marks what it sends anyway with the ``fail_open`` split; any such traffic
pages, since those replicas' own checks say they should not serve. A replica whose model has
loaded but whose warm-up does not pass (``inferwatch_replica_startup_phase``) is named as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch import wire
from inferwatch.mixin import promql, recording
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Alert, Panel
from inferwatch.mixin.promql import MODEL, MODEL_VERSION, by, metric, on

#: each alert's defaults (alerts.<name> in the config, where a user's file overrides them):
#: ``for`` and its own thresholds
SETTINGS: Mapping[str, Mapping[str, Any]] = {
    "InferwatchEngineDown": {"for": "1m"},
    # requests held and no token generated (a hung engine that still answers its scrapes)
    "InferwatchEngineStalled": {"for": "2m"},
    "InferwatchSidecarDown": {"for": "2m"},
    "InferwatchScrapeErrors": {"for": "10m", "min_errors": 3},
    "InferwatchErrorRatioHigh": {"for": "5m", "warning": 0.01, "critical": 0.05, "min_rate": 0.05},
    # share of one route's answers that are 4xx, with at least min_rate of them per second
    "InferwatchEngineClientErrorsSurging": {"for": "10m", "share": 0.2, "min_rate": 0.1},
    "InferwatchReplicaNotReady": {"for": "2m"},
    # model loaded (phase engine_healthy) but the warm-up gate not passed for this long
    "InferwatchReplicaStuckInWarmup": {"for": "10m"},
    # share of a model's replicas not ready above which the model pages
    "InferwatchModelReplicasNotReady": {"for": "1m", "share": 0.5},
    # any request the gateway sent regardless of readiness (fail-open: no ready replica of the
    # model or its fallback)
    "InferwatchFailingOpen": {"for": "0s"},
}


def alerts(config: Config) -> list[Alert]:
    return [
        *_down(config),
        *_stalled(config),
        *_scrape_errors(config),
        *_error_ratio(config),
        *_client_errors(config),
        *_readiness(config),
        *_fail_open(config),
        *_startup(config),
    ]


def _down(config: Config) -> list[Alert]:
    engine = config.alert("InferwatchEngineDown")
    sidecar = config.alert("InferwatchSidecarDown")
    up_selector = config.selectors["sidecar_up"]
    return [
        Alert(
            name="InferwatchEngineDown",
            severity="critical",
            expr=f"{metric(config, 'engine_up')} == 0",
            for_=engine.for_,
            summary="An inference engine does not answer its sidecar.",
            description=(
                "The engine of {{ $labels.model }} {{ $labels.model_version }} on pod "
                "{{ $labels.pod }} ({{ $labels.instance }}) has not answered the sidecar's "
                f"scrapes for {engine.for_}; the replica is out of /readyz."
            ),
            panel=Panel("fleet", 1),
        ),
        Alert(
            name="InferwatchSidecarDown",
            severity="warning",
            expr=f"up{{{up_selector}}} == 0" if up_selector else "up == 0",
            for_=sidecar.for_,
            summary="Prometheus cannot scrape an inferwatch target.",
            description=(
                "Target {{ $labels.instance }} of job {{ $labels.job }} has failed every "
                f"scrape for {sidecar.for_}: its replica's engine, GPU and quality series "
                "are missing, so no other alert can fire for it."
            ),
            panel=Panel("fleet", 2),
        ),
    ]


def _stalled(config: Config) -> list[Alert]:
    """Requests held but no token made: a hung engine, which still answers its scrapes (and
    /readyz), so neither EngineDown nor readiness sees it."""
    settings = config.alert("InferwatchEngineStalled")
    window = config.rate_window
    # namespace and job stay: the receiver's namespace guard and its replica rules need them
    kept = (*MODEL_VERSION, "namespace", "job", "instance", "pod")
    replica = by(config, kept)
    held = (
        f"sum {replica} ({metric(config, 'engine_requests_running')})\n"
        f"+ sum {replica} ({metric(config, 'engine_requests_waiting')})"
    )
    tokens = f"sum {replica} (rate({metric(config, 'engine_generation_tokens')}[{window}]))"
    same = on(config, kept)
    return [
        Alert(
            name="InferwatchEngineStalled",
            severity="critical",
            expr=f"({held}) > 0\nand {same} {tokens} == 0",
            for_=settings.for_,
            summary="An inference engine holds requests but generates nothing.",
            description=(
                "The engine of {{ $labels.model }} {{ $labels.model_version }} on pod "
                "{{ $labels.pod }} ({{ $labels.instance }}) holds {{ $value }} requests and "
                f"generated no token over {window}: it hangs, and its /readyz still passes."
            ),
            panel=Panel("fleet", 1),
        )
    ]


def _scrape_errors(config: Config) -> list[Alert]:
    settings = config.alert("InferwatchScrapeErrors")
    window = config.rate_window
    errors = metric(config, "engine_scrape_errors")
    return [
        Alert(
            name="InferwatchScrapeErrors",
            severity="warning",
            expr=f"increase({errors}[{window}]) >= {promql.number(settings.number('min_errors'))}",
            for_=settings.for_,
            summary="A sidecar keeps failing to read its engine's metrics.",
            description=(
                "The sidecar at {{ $labels.instance }} failed {{ $value | humanize }} engine "
                f"scrapes in {window} with reason {{{{ $labels.reason }}}}."
            ),
            panel=Panel("fleet", 3),
        )
    ]


def _error_ratio(config: Config) -> list[Alert]:
    settings = config.alert("InferwatchErrorRatioHigh")
    ratio = recording.error_ratio(config)
    traffic = recording.requests(config)
    floor = promql.number(settings.number("min_rate"))
    result = []
    for severity in ("critical", "warning"):
        threshold = settings.number(severity)
        result.append(
            Alert(
                name="InferwatchErrorRatioHigh",
                severity=severity,
                expr=f"{ratio} > {promql.number(threshold)}\nand {traffic} > {floor}",
                for_=settings.for_,
                summary="A model version fails too many requests.",
                description=(
                    "{{ $labels.model }} {{ $labels.model_version }} failed "
                    "{{ $value | humanizePercentage }} of its requests over the last "
                    f"{config.rate_window} (threshold {promql.number(threshold * 100)}%)."
                ),
                panel=Panel("fleet", 4),
            )
        )
    return result


def _client_errors(config: Config) -> list[Alert]:
    """4xx answers are the client's fault one by one, but a surge of them is an outage for
    someone: a client or proxy rolled out with prompts over the context, a max_tokens the
    deployment does not allow, or a model name it no longer serves. The engine refuses those
    before they become requests, so neither the error ratio nor the availability SLO sees
    them (they count 5xx only)."""
    settings = config.alert("InferwatchEngineClientErrorsSurging")
    window = config.rate_window
    route = (*MODEL_VERSION, "handler")
    four = metric(config, "engine_http_requests", 'status="4xx"')
    refused = f"sum {by(config, route)} (rate({four}[{window}]))"
    answered = f"sum {by(config, route)} (rate({metric(config, 'engine_http_requests')}[{window}]))"
    same = on(config, route)
    share = settings.number("share")
    return [
        Alert(
            name="InferwatchEngineClientErrorsSurging",
            severity="warning",
            expr=(
                f"{refused}\n/ {same} {answered}\n> {promql.number(share)}\n"
                f"and {same} {refused} > {promql.number(settings.number('min_rate'))}"
            ),
            for_=settings.for_,
            summary="An engine refuses a surge of requests as the client's fault (4xx).",
            description=(
                "The engines of {{ $labels.model }} {{ $labels.model_version }} answered "
                "{{ $value | humanizePercentage }} of the requests on {{ $labels.handler }} "
                f"with a 4xx over the last {window} (threshold "
                f"{promql.number(share * 100)}%): clients send what this deployment cannot "
                "serve (a prompt over the context, max_tokens too large, a model name it does "
                "not serve)."
            ),
            panel=Panel("latency", 9),
        )
    ]


def _readiness(config: Config) -> list[Alert]:
    one = config.alert("InferwatchReplicaNotReady")
    share = config.alert("InferwatchModelReplicasNotReady")
    ready = metric(config, "replica_ready")
    # per namespace: the receiver's namespace guard and its route shift need the label
    model = (*MODEL, "namespace")
    per_replica = f"min {by(config, (*model, 'pod'))} ({ready})"
    return [
        Alert(
            name="InferwatchReplicaNotReady",
            severity="warning",
            expr=f"{ready} == 0",
            for_=one.for_,
            summary="A replica fails a readiness condition and takes no traffic.",
            description=(
                "Pod {{ $labels.pod }} ({{ $labels.model }} {{ $labels.model_version }}) "
                "fails its {{ $labels.condition }} readiness condition; routers send it no "
                "traffic until it passes again."
            ),
            panel=Panel("fleet", 5),
        ),
        Alert(
            name="InferwatchModelReplicasNotReady",
            severity="critical",
            expr=(
                f"count {by(config, model)} ({per_replica} == 0)\n"
                f"/ {on(config, model)} count {by(config, model)} ({per_replica})\n"
                f"> {promql.number(share.number('share'))}"
            ),
            for_=share.for_,
            summary="Too many replicas of a model are out of service.",
            description=(
                "{{ $value | humanizePercentage }} of the replicas of {{ $labels.model }} fail "
                f"readiness (threshold {promql.number(share.number('share') * 100)}%): the "
                "rest carry its traffic or it moves to a fallback model."
            ),
            panel=Panel("fleet", 6),
        ),
    ]


def _fail_open(config: Config) -> list[Alert]:
    settings = config.alert("InferwatchFailingOpen")
    window = config.rate_window
    opened = metric(config, "tenancy_requests", f'split="{wire.FAIL_OPEN}"')
    return [
        Alert(
            name="InferwatchFailingOpen",
            severity="critical",
            expr=f"sum {by(config, MODEL)} (rate({opened}[{window}])) > 0",
            for_=settings.for_,
            summary="The gateway sends a model's traffic to replicas that are not ready.",
            description=(
                "{{ $labels.model }} and its fallback have no ready replica, so the gateway "
                "serves its requests from its unready replicas anyway ({{ $value | humanize }} "
                f"requests/s over {window}): answers may be slow, wrong or failing."
            ),
            panel=Panel("fleet", 6),
        )
    ]


def _startup(config: Config) -> list[Alert]:
    stuck = config.alert("InferwatchReplicaStuckInWarmup")
    loaded = metric(config, "replica_startup_phase", 'phase="engine_healthy"')
    return [
        Alert(
            name="InferwatchReplicaStuckInWarmup",
            severity="warning",
            expr=f"{loaded} == 1",
            for_=stuck.for_,
            summary="A replica has loaded its model but its warm-up does not pass.",
            description=(
                "Pod {{ $labels.pod }} ({{ $labels.model }} {{ $labels.model_version }}) "
                f"loaded its model more than {stuck.for_} ago and is still warming up: its "
                "warm-up requests fail or overrun their deadline, so it stays unready and "
                "the capacity it was started for is not there."
            ),
            panel=Panel("replica", 11),
        ),
    ]
