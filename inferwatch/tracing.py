"""OpenTelemetry tracing for the components that make requests on a user's behalf (the
tenancy proxy, the probe runner): the options they share and the tracer provider they build.

Tracing is optional (the ``otel`` extra) and off unless ``--otlp-endpoint`` is given: without
it no OpenTelemetry module is imported and the request path only tests for ``None``. Spans go
over OTLP/HTTP (protobuf) in batches from a background thread, sampled by trace id at the
configured ratio. A caller's ``traceparent`` decides for its own trace, as OpenTelemetry's
``ParentBased`` sampler does: one that says sampled on every request is recorded on every
request, whatever the ratio, unless the caller sampling is ``ratio`` (the ratio then judges
those too; a caller's "not sampled" still stands). Shutdown exports what is still batched
within ``shutdown_s``: a collector that accepts and never answers would otherwise hold it
for the exporter's own timeout (10 s) and its retries. The resource names the
service and, from the downward API's environment (``POD_NAME``, ``POD_NAMESPACE``,
``NODE_NAME``, as the Kubernetes kit sets them), the pod; ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` are read as in every OpenTelemetry SDK.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import click

from inferwatch.clikit import BadInput, F, FiniteFloat, option_group
from inferwatch.logs import log_event

if TYPE_CHECKING:  # the SDK is imported only when tracing is on
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "DOWNWARD_API",
    "TraceOptions",
    "caller_sampling_option",
    "options",
    "provider",
    "resource_attributes",
    "traces_url",
]

#: downward-API environment variables -> OpenTelemetry resource attributes (k8s semconv)
DOWNWARD_API = {
    "POD_NAME": "k8s.pod.name",
    "POD_NAMESPACE": "k8s.namespace.name",
    "NODE_NAME": "k8s.node.name",
}
#: where an OTLP/HTTP collector takes traces, under its base URL (as OTEL_EXPORTER_OTLP_ENDPOINT)
TRACES_PATH = "/v1/traces"
#: seconds a shutdown waits for the spans still batched, where the command names no grace
DEFAULT_SHUTDOWN_S = 5.0
#: whose decision a caller's sampled traceparent is: its own (OpenTelemetry's default), or
#: the ratio's, so that a caller cannot have every request recorded
CallerSampling = Literal["follow", "ratio"]

logger = logging.getLogger("inferwatch.tracing")


@dataclass(frozen=True)
class TraceOptions:
    """``endpoint`` empty: tracing off."""

    endpoint: str = ""
    ratio: float = 1.0
    caller_sampling: CallerSampling = "follow"
    #: the longest a shutdown waits to export what is still batched
    shutdown_s: float = DEFAULT_SHUTDOWN_S


def options(command: F) -> F:
    """``--otlp-endpoint`` and ``--otlp-sampling-ratio``, for a command that traces."""
    return option_group(
        click.option(
            "--otlp-endpoint",
            default="",
            show_envvar=True,
            help="OTLP/HTTP collector base URL (http://collector:4318) to send traces to "
            "(its /v1/traces); empty: no tracing. Needs the otel extra "
            "(pip install 'inferwatch[otel]').",
        ),
        click.option(
            "--otlp-sampling-ratio",
            type=FiniteFloat(0.0, 1.0),
            default=1.0,
            show_default=True,
            show_envvar=True,
            help="Share of traces started here that are recorded (a caller's traceparent "
            "decides for its own trace).",
        ),
    )(command)


def caller_sampling_option(command: F) -> F:
    """``--otlp-caller-sampling``, for a command that takes requests with a traceparent."""
    return click.option(
        "--otlp-caller-sampling",
        type=click.Choice(["follow", "ratio"]),
        default="follow",
        show_default=True,
        show_envvar=True,
        help="Whose decision a caller's sampled traceparent is: follow records every trace "
        "the caller sampled (OpenTelemetry's ParentBased), ratio holds those to "
        "--otlp-sampling-ratio too, so that no caller can have every request recorded.",
    )(command)


def traces_url(endpoint: str) -> str:
    """The URL spans are posted to: ``endpoint`` itself if it names the traces path."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def resource_attributes(service: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``service.name`` (unless ``OTEL_SERVICE_NAME`` names it, as the SDK then does) and the
    pod's identity from the downward API's variables."""
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    for variable, attribute in DOWNWARD_API.items():
        value = environ.get(variable, "")
        if value:
            attributes[attribute] = value
    return attributes


def provider(
    service: str,
    trace: TraceOptions,
    *,
    exporter: Callable[[str], Any] | None = None,
) -> TracerProvider | None:
    """A tracer provider exporting to ``trace.endpoint``, or None when tracing is off.

    ``exporter`` makes the span exporter from the traces URL (the OTLP/HTTP one by default).
    Raises ``BadInput`` when tracing is asked for without the ``otel`` extra.
    """
    if not trace.endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise BadInput(
            f"--otlp-endpoint needs the otel extra (pip install 'inferwatch[otel]'): {exc}"
        ) from None

    class BoundedProvider(TracerProvider):
        """Its shutdown (the command's, or the SDK's at exit) waits ``shutdown_s`` at most."""

        def shutdown(self) -> None:
            _within(super().shutdown, trace.shutdown_s)

    ratio = TraceIdRatioBased(trace.ratio)
    capped = trace.caller_sampling == "ratio"
    made = BoundedProvider(
        resource=Resource.create(resource_attributes(service)),
        sampler=ParentBased(ratio, remote_parent_sampled=ratio) if capped else ParentBased(ratio),
    )
    url = traces_url(trace.endpoint)
    made.add_span_processor(
        BatchSpanProcessor(exporter(url) if exporter else OTLPSpanExporter(endpoint=url))
    )
    return made


def _within(shutdown: Callable[[], object], seconds: float) -> None:
    """Run ``shutdown`` on a daemon thread and wait for it at most ``seconds``: past that,
    what is still batched is given up (one line), and the thread holds no exit."""
    done = threading.Event()

    def run() -> None:
        try:
            shutdown()
        finally:
            done.set()

    threading.Thread(target=run, name="inferwatch-trace-shutdown", daemon=True).start()
    if not done.wait(max(seconds, 0.0)):
        log_event(
            logger, logging.WARNING, "trace export cut short", waited_s=seconds,
            reason="the collector did not take the last spans in time",
        )  # fmt: skip
