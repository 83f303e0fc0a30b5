"""OpenTelemetry tracing for the components that make requests on a user's behalf (the
tenancy proxy, the probe runner): the options they share and the tracer provider they build.

Tracing is optional (the ``otel`` extra) and off unless ``--otlp-endpoint`` is given: without
it no OpenTelemetry module is imported and the request path only tests for ``None``. Spans go
over OTLP/HTTP (protobuf) in batches from a background thread, sampled by trace id at the
configured ratio unless the caller's ``traceparent`` already decided. The resource names the
service and, from the downward API's environment (``POD_NAME``, ``POD_NAMESPACE``,
``NODE_NAME``, as the Kubernetes kit sets them), the pod; ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` are read as in every OpenTelemetry SDK.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from inferwatch.clikit import BadInput, F, FiniteFloat, option_group

if TYPE_CHECKING:  # the SDK is imported only when tracing is on
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "DOWNWARD_API",
    "TraceOptions",
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


@dataclass(frozen=True)
class TraceOptions:
    """``endpoint`` empty: tracing off."""

    endpoint: str = ""
    ratio: float = 1.0


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
    made = TracerProvider(
        resource=Resource.create(resource_attributes(service)),
        sampler=ParentBased(TraceIdRatioBased(trace.ratio)),
    )
    url = traces_url(trace.endpoint)
    made.add_span_processor(
        BatchSpanProcessor(exporter(url) if exporter else OTLPSpanExporter(endpoint=url))
    )
    return made
