"""A span per metered request, in the OpenTelemetry GenAI semantic conventions.

The span's parent is the caller's ``traceparent`` (W3C trace context), and the engine gets the
proxy's own span as its parent, so an engine that traces too (vLLM ``--otlp-traces-endpoint``)
joins the same trace. Attributes are the conventions' ``gen_ai.*`` (operation, system, request
and response model, token usage, finish reasons) and ours, ``inferwatch.*`` (tenant, versions,
outcome); events mark admission (the end of queueing) and the first token. A sampled
request's trace id is also the exemplar on the latency buckets it falls in
(:mod:`inferwatch.proxy.metrics`), so a slow bucket on a board opens its trace.

Built only when tracing is on (:func:`inferwatch.tracing.provider`); the request path holds
``None`` otherwise, and nothing here is imported.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferwatch.proxy.exchange import Exchange, Scope

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

#: gen_ai.operation.name per metered route
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}
#: gen_ai.system: the API the proxy serves and meters (any OpenAI-compatible engine)
SYSTEM = "openai"
_CONTEXT_HEADERS = (b"traceparent", b"tracestate")
#: outcomes that mark the span an error (the engine or the proxy failed the request)
_ERRORS = frozenset({"upstream_error", "engine_error", "shutdown_cancelled"})


class RequestTracing:
    def __init__(self, provider: TracerProvider) -> None:
        self._tracer = provider.get_tracer("inferwatch.proxy")
        self._propagator = TraceContextTextMapPropagator()

    def start(self, exchange: Exchange, scope: Scope) -> None:
        """Open the request's span and hand the engine its context instead of the caller's."""
        headers = scope["headers"]
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in headers
            if name in _CONTEXT_HEADERS
        }
        operation = OPERATIONS.get(exchange.path, exchange.path)
        span = self._tracer.start_span(
            operation,
            context=self._propagator.extract(carrier) if carrier else None,
            kind=SpanKind.SERVER,
            attributes={"gen_ai.operation.name": operation, "gen_ai.system": SYSTEM},
        )
        exchange.span = span
        context = span.get_span_context()
        if context.trace_flags.sampled:
            exchange.trace_id = format(context.trace_id, "032x")
            outgoing: dict[str, str] = {}
            self._propagator.inject(outgoing, set_span_in_context(span))
            headers[:] = [
                *(item for item in headers if item[0] not in _CONTEXT_HEADERS),
                *((name.encode(), value.encode("latin-1")) for name, value in outgoing.items()),
            ]

    def admitted(self, exchange: Exchange) -> None:
        """Mark the end of reading, counting and queueing: the engine's turn begins."""
        if exchange.span is not None:
            exchange.span.add_event("inferwatch.admitted")

    def end(self, exchange: Exchange) -> None:
        """Describe the finished request on its span and end it."""
        span = exchange.span
        if span is None:
            return
        exchange.span = None
        if not span.is_recording():
            span.end()
            return
        operation = OPERATIONS.get(exchange.path, exchange.path)
        if exchange.model:
            span.update_name(f"{operation} {exchange.model}")
            span.set_attribute("gen_ai.request.model", exchange.model)
        model_version, engine_version, prompt_version = exchange.versions
        span.set_attributes(
            {
                "inferwatch.tenant": exchange.tenant,
                "inferwatch.model_version": model_version,
                "inferwatch.engine_version": engine_version,
                "inferwatch.prompt_version": prompt_version,
                "inferwatch.outcome": exchange.outcome or "ok",
                "http.response.status_code": exchange.status,
            }
        )
        meter = exchange.meter
        if meter is not None:
            if meter.response_model:
                span.set_attribute("gen_ai.response.model", meter.response_model)
            if meter.finish_reasons:
                span.set_attribute("gen_ai.response.finish_reasons", meter.finish_reasons)
        if exchange.usage is not None:
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": exchange.usage.prompt,
                    "gen_ai.usage.output_tokens": exchange.usage.completion,
                }
            )
        if exchange.ttft is not None:
            # the exchange's clock is perf_counter; the span's is the wall clock
            elapsed = time.perf_counter() - exchange.start
            first = time.time_ns() - int((elapsed - exchange.ttft) * 1e9)
            span.add_event("gen_ai.first_token", timestamp=first)
        if exchange.outcome in _ERRORS or exchange.status >= 500:
            span.set_status(Status(StatusCode.ERROR, exchange.error or exchange.outcome))
            span.set_attribute("error.type", exchange.outcome or str(exchange.status))
        span.end()
