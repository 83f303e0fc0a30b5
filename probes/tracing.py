"""A span per probe, in the OpenTelemetry GenAI semantic conventions (a client span: the
runner calls the model), whose context goes out as the probe's ``traceparent`` so that the
proxy's and the engine's spans of the same request join its trace.

Built only when tracing is on (:func:`inferwatch.tracing.provider`); the runner holds
``None`` otherwise, and nothing here is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferwatch.probes.golden import Golden
from inferwatch.probes.reply import Reply
from inferwatch.probes.scoring import Outcome

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


class ProbeTracing:
    def __init__(self, provider: TracerProvider) -> None:
        self._tracer = provider.get_tracer("inferwatch.probes")
        self._propagator = TraceContextTextMapPropagator()

    def start(
        self, target: str, route: str, golden: Golden, model: str
    ) -> tuple[Span, dict[str, str]]:
        """The probe's span and the headers that carry its context to the target."""
        span = self._tracer.start_span(
            f"chat {model}",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.system": "openai",
                "gen_ai.request.model": model,
                "gen_ai.request.max_tokens": golden.max_tokens,
                "inferwatch.probe": golden.id,
                "inferwatch.target": target,
                "inferwatch.route": route,
            },
        )
        headers: dict[str, str] = {}
        self._propagator.inject(headers, set_span_in_context(span))
        return span, headers

    def end(self, span: Span, reply: Reply | None, outcome: Outcome | None) -> None:
        """Describe the reply and the verdict on the span and end it (no outcome: skipped)."""
        if reply is not None and span.is_recording():
            if reply.model:
                span.set_attribute("gen_ai.response.model", reply.model)
            if reply.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": reply.prompt_tokens,
                    "gen_ai.usage.output_tokens": reply.completion_tokens,
                    "http.response.status_code": reply.status,
                }
            )
            if reply.error:
                span.set_status(Status(StatusCode.ERROR, reply.error))
                span.set_attribute("error.type", reply.error)
        if outcome is None:
            span.set_attribute("inferwatch.probe.result", "skipped")
        else:
            span.set_attribute("inferwatch.probe.result", "pass" if outcome.passed else "fail")
            if outcome.stage:
                span.set_attribute("inferwatch.probe.failed_stage", outcome.stage)
        span.end()
