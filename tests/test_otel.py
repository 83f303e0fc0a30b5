"""OpenTelemetry: the proxy's span per request and the probe runner's per probe, sent by the
real OTLP/HTTP exporter to a local receiver that decodes them with opentelemetry-proto, and a
request's trace id as the exemplar on its latency buckets in the OpenMetrics exposition."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from inferwatch import tracing
from inferwatch.cli import main
from inferwatch.clikit import BadInput
from inferwatch.dashboards import queries
from inferwatch.exporters import sidecar_cli
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.probes import client, golden
from inferwatch.probes.runner import ProbeRunner, Target
from inferwatch.serving.histogram import Histogram
from support.otlp import Receiver, Span, hung_collector, receiver
from support.proxy_stack import CHAT, KEYS, Engine, Stack, auth
from support.shared import REPO
from support.wait import wait_for

pytestmark = pytest.mark.unit

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def otlp() -> Iterator[Receiver]:
    with receiver() as running:
        yield running


@pytest.fixture
def traced(
    otlp: Receiver, stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Stack, TracerProvider]]:
    """A proxy tracing every request to ``otlp``, in pod ``proxy-0`` (downward API)."""
    monkeypatch.setenv("POD_NAME", "proxy-0")
    monkeypatch.setenv("POD_NAMESPACE", "serving")
    provider = tracing.provider("inferwatch-proxy", tracing.TraceOptions(otlp.url, 1.0))
    assert provider is not None
    yield stack(tracer_provider=provider), provider
    provider.shutdown()


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


def span_of(otlp: Receiver, provider: TracerProvider, trace_id: str) -> Span:
    return otlp.wait_for_span(
        lambda span: span.trace_id == trace_id,
        f"the span of trace {trace_id}",
        provider.force_flush,
    )


def test_a_request_is_one_span_under_the_callers_parent_with_genai_attributes(
    otlp: Receiver, traced: tuple[Stack, TracerProvider]
) -> None:
    proxy, provider = traced
    seen = len(proxy.engine.headers_seen)
    response = proxy.client.post(
        CHAT,
        json=chat(),
        headers=auth("acme", traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"),
    )
    assert response.status_code == 200
    span = span_of(otlp, provider, CALLER_TRACE)
    assert span.parent_span_id == CALLER_SPAN
    assert span.name == "chat m"
    assert span.kind == 2  # SERVER
    assert span.attributes["gen_ai.operation.name"] == "chat"
    assert span.attributes["gen_ai.system"] == "openai"
    assert span.attributes["gen_ai.request.model"] == "m"
    assert span.attributes["gen_ai.response.model"] == "m"
    usage = response.json()["usage"]
    assert span.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert span.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 4
    assert span.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert span.attributes["inferwatch.tenant"] == "acme"
    assert span.attributes["inferwatch.outcome"] == "ok"
    assert "inferwatch.model_version" in span.attributes
    assert span.events == ["inferwatch.admitted"]
    assert span.resource["service.name"] == "inferwatch-proxy"
    assert span.resource["k8s.pod.name"] == "proxy-0"
    assert span.resource["k8s.namespace.name"] == "serving"
    assert otlp.paths[-1] == "/v1/traces"
    # the engine's parent is the proxy's span, in the same trace
    (engine_saw,) = proxy.engine.headers_seen[seen:]
    assert engine_saw["traceparent"] == f"00-{CALLER_TRACE}-{span.span_id}-01"


def exemplars(text: str, family_name: str) -> dict[str, str]:
    """le -> exemplar trace id of one histogram family's buckets (OpenMetrics text)."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == family_name:
            for sample in family.samples:
                if sample.name.endswith("_bucket") and sample.exemplar is not None:
                    out[sample.labels["le"]] = sample.exemplar.labels["trace_id"]
    return out


def test_a_streamed_requests_trace_id_is_the_exemplar_of_its_latency_buckets(
    otlp: Receiver, traced: tuple[Stack, TracerProvider]
) -> None:
    proxy, provider = traced
    with proxy.client.stream("POST", CHAT, json=chat(stream=True), headers=auth("globex")) as r:
        assert r.status_code == 200
        r.read()
    page = httpx.get(
        proxy.server.metrics_url + "/metrics", headers={"accept": OPENMETRICS}, timeout=10
    ).text
    ttft = exemplars(page, "inferwatch_tenancy_time_to_first_token_seconds")
    duration = exemplars(page, "inferwatch_tenancy_request_duration_seconds")
    assert len(ttft) == 1 and len(duration) == 1, page
    (trace_id,) = ttft.values()
    assert list(duration.values()) == [trace_id]
    span = span_of(otlp, provider, trace_id)
    assert span.parent_span_id == ""  # no traceparent: the proxy starts the trace
    assert span.attributes["inferwatch.tenant"] == "globex"
    assert span.events == ["inferwatch.admitted", "gen_ai.first_token"]
    # the Prometheus text format carries no exemplars
    plain = proxy.metrics()
    assert trace_id not in plain


def test_a_refused_request_is_a_span_too(
    otlp: Receiver, traced: tuple[Stack, TracerProvider]
) -> None:
    proxy, provider = traced
    trace = "a" * 32
    response = proxy.client.post(
        CHAT,
        json=chat(),
        headers={"authorization": "Bearer wrong", "traceparent": f"00-{trace}-{'b' * 16}-01"},
    )
    assert response.status_code == 401
    span = span_of(otlp, provider, trace)
    assert span.attributes["inferwatch.outcome"] == "rejected_auth"
    assert span.attributes["http.response.status_code"] == 401
    assert "inferwatch.admitted" not in span.events


def test_ratio_zero_records_no_trace_and_no_exemplar_unless_the_caller_sampled(
    otlp: Receiver, stack: Callable[..., Stack]
) -> None:
    provider = tracing.provider("inferwatch-proxy", tracing.TraceOptions(otlp.url, 0.0))
    assert provider is not None
    proxy = stack(tracer_provider=provider)
    try:
        with proxy.client.stream("POST", CHAT, json=chat(stream=True), headers=auth("acme")) as r:
            r.read()
        page = httpx.get(
            proxy.server.metrics_url + "/metrics", headers={"accept": OPENMETRICS}, timeout=10
        ).text
        assert exemplars(page, "inferwatch_tenancy_time_to_first_token_seconds") == {}
        sampled = "c" * 32
        proxy.client.post(
            CHAT, json=chat(), headers=auth("acme", traceparent=f"00-{sampled}-{'d' * 16}-01")
        )
        span_of(otlp, provider, sampled)  # the caller's decision stands
        assert {span.trace_id for span in otlp.spans} == {sampled}
    finally:
        provider.shutdown()


def test_tracing_is_off_without_an_endpoint() -> None:
    assert tracing.provider("inferwatch-proxy", tracing.TraceOptions()) is None


def test_an_endpoint_without_the_otel_extra_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(
        BadInput, match=r"needs the otel extra \(pip install 'inferwatch\[otel\]'\)"
    ):
        tracing.provider("inferwatch-proxy", tracing.TraceOptions("http://127.0.0.1:4318"))


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
    ],
)
def test_the_endpoint_is_the_collectors_base_url(endpoint: str, url: str) -> None:
    assert tracing.traces_url(endpoint) == url


def test_resource_attributes_come_from_the_downward_api() -> None:
    environ = {"POD_NAME": "p-0", "NODE_NAME": "gpu-node-3", "POD_NAMESPACE": ""}
    assert tracing.resource_attributes("inferwatch-probe", environ) == {
        "service.name": "inferwatch-probe",
        "k8s.pod.name": "p-0",
        "k8s.node.name": "gpu-node-3",
    }
    named = tracing.resource_attributes("inferwatch-probe", {"OTEL_SERVICE_NAME": "probes-eu"})
    assert "service.name" not in named  # the SDK takes OTEL_SERVICE_NAME's


def test_a_probe_is_a_client_span_and_the_proxys_span_joins_its_trace(
    otlp: Receiver, traced: tuple[Stack, TracerProvider]
) -> None:
    proxy, provider = traced
    goldens = golden.load(golden.DEFAULT_SET)
    target = Target("via-proxy", client.Endpoint(proxy.url, "m", KEYS["acme"]), route="router")

    async def probe_once() -> None:
        runner = ProbeRunner(goldens, [target], tracer_provider=provider)
        try:
            await runner.probe_once(target, goldens.probes[0])
        finally:
            await runner.aclose()

    asyncio.run(probe_once())
    probe = otlp.wait_for_span(
        lambda span: "inferwatch.probe" in span.attributes, "the probe's span", provider.force_flush
    )
    assert probe.kind == 3  # CLIENT
    assert probe.name == "chat m"
    assert probe.attributes["inferwatch.probe"] == goldens.probes[0].id
    assert probe.attributes["inferwatch.target"] == "via-proxy"
    assert probe.attributes["inferwatch.route"] == "router"
    assert probe.attributes["inferwatch.probe.result"] in ("pass", "fail")
    assert probe.attributes["gen_ai.usage.output_tokens"] > 0
    proxied = span_of(otlp, provider, probe.trace_id)
    assert proxied.parent_span_id == probe.span_id
    assert proxied.attributes["inferwatch.tenant"] == "acme"


def test_the_latency_board_draws_the_proxys_exemplars() -> None:
    board = json.loads((REPO / "dashboards" / "generated" / "latency.json").read_text())
    traced = [
        target
        for panel in queries.panels(board)
        for target in panel.get("targets", [])
        if "inferwatch_tenancy_time_to_first_token_seconds_bucket" in target["expr"]
    ]
    assert traced and all(target.get("exemplar") is True for target in traced)


def test_an_engine_failure_marks_the_span_an_error(
    otlp: Receiver, traced: tuple[Stack, TracerProvider]
) -> None:
    proxy, provider = traced
    trace = "e" * 32
    response = proxy.client.post(
        CHAT,
        json=chat(),
        headers=auth(
            "acme", traceparent=f"00-{trace}-{'f' * 16}-01", **{"x-scenario": "error_500"}
        ),
    )
    assert response.status_code == 500
    span = span_of(otlp, provider, trace)
    assert span.status_code == 2  # ERROR
    assert span.attributes["error.type"] == "engine_error"
    assert span.attributes["inferwatch.outcome"] == "engine_error"


def test_a_bucket_keeps_its_latest_traced_observation_across_a_fold() -> None:
    histogram = Histogram((0.1, 1.0))
    histogram.observe(0.05)
    assert histogram.buckets() == [("0.1", 1), ("1.0", 1), ("+Inf", 1)]
    histogram.observe(0.5, "a" * 32)
    histogram.observe(0.7, "b" * 32)
    le, count, exemplar = histogram.buckets()[1]
    assert (le, count, exemplar.labels, exemplar.value) == ("1.0", 3, {"trace_id": "b" * 32}, 0.7)
    folded = Histogram((0.1, 1.0))
    folded.observe(5.0, "c" * 32)
    folded.merge(histogram)  # an evicted tenant's series folded into ``other``
    with_exemplars = {b[0]: b[2].labels["trace_id"] for b in folded.buckets() if len(b) == 3}
    assert with_exemplars == {"1.0": "b" * 32, "+Inf": "c" * 32}


def test_the_sidecars_probes_are_spans_when_given_an_endpoint(
    otlp: Receiver, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``inferwatch sidecar --probes`` traces each probe as the standalone runner does."""
    made: list[Sequence[object]] = []

    class Recorded(Sidecar):
        def __init__(self, sources: Sequence[object], **kw: Any) -> None:
            super().__init__(sources, **kw)
            made.append(sources)

    monkeypatch.setattr(sidecar_cli, "Sidecar", Recorded)
    monkeypatch.setattr(sidecar_cli.uvicorn_server, "serve", lambda app, sock, limits: sock.close())
    monkeypatch.setenv("POD_NAME", "model-0")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # ms: the SDK's batch export delay
    args = ["sidecar", "--listen=127.0.0.1:0", f"--engine-url={engine.url}/metrics",
            "--no-collector.gpu", "--probes=default", "--model=m",
            f"--otlp-endpoint={otlp.url}"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    ((runner,),) = ([s for s in sources if isinstance(s, ProbeRunner)] for sources in made)
    (target,) = runner.targets

    async def probe_once() -> None:
        try:
            await runner.probe_once(target, runner.goldens.probes[0])
        finally:
            await runner.aclose()

    asyncio.run(probe_once())
    # no handle on the runner's provider to flush: its batch goes out within the delay set
    probe = otlp.wait_for_span(lambda span: "inferwatch.probe" in span.attributes,
                               "the sidecar probe's span", lambda: None)  # fmt: skip
    assert probe.attributes["inferwatch.route"] == "direct"
    assert probe.resource["service.name"] == "inferwatch-sidecar"
    assert probe.resource["k8s.pod.name"] == "model-0"


TRACE, PARENT = "a" * 32, "b" * 16
VALID = f"00-{TRACE}-{PARENT}-01"
#: each way a traceparent breaks the W3C grammar (https://www.w3.org/TR/trace-context/)
BROKEN_PARENTS = {
    "10-kb": "00-" + "a" * 10_000,
    "version-ff": f"ff-{TRACE}-{PARENT}-01",
    "zero-trace": f"00-{'0' * 32}-{PARENT}-01",
    "zero-parent": f"00-{TRACE}-{'0' * 16}-01",
    "upper-case": f"00-{TRACE.upper()}-{PARENT}-01",
    "version-00-with-more": f"00-{TRACE}-{PARENT}-01-extra",
    "not-hex": f"00-{'g' * 32}-{PARENT}-01",
    "short-flags": f"00-{TRACE}-{PARENT}-1",
    "future-version-too-long": f"01-{TRACE}-{PARENT}-01-" + "x" * 1000,
}

BROKEN_STATES = ("x=" + "y" * 600, "=novalue", "Upper=1", "a=1,a=2",
                 ",".join(f"k{i}=v" for i in range(33)))  # fmt: skip


def engine_saw(proxy: Stack, headers: list[tuple[str, str]]) -> dict[str, str]:
    seen = len(proxy.engine.headers_seen)
    reply = proxy.client.post(CHAT, json=chat(), headers=[*auth("acme").items(), *headers])
    assert reply.status_code == 200, reply.text
    (saw,) = proxy.engine.headers_seen[seen:]
    return {k: v for k, v in saw.items() if k in ("traceparent", "tracestate")}


@pytest.mark.parametrize("ratio", [None, 0.0], ids=["tracing-off", "not-sampled"])
@pytest.mark.parametrize("parent", list(BROKEN_PARENTS.values()), ids=list(BROKEN_PARENTS))
def test_an_invalid_traceparent_never_reaches_the_engine(
    otlp: Receiver, stack: Callable[..., Stack], ratio: float | None, parent: str
) -> None:
    """Not with tracing off, nor where the proxy's own span is not sampled (the caller's
    headers would then go on as sent): dropped, and its tracestate with it."""
    options = tracing.TraceOptions(otlp.url, ratio or 0.0)
    provider = None if ratio is None else tracing.provider("inferwatch-proxy", options)
    proxy = stack() if provider is None else stack(tracer_provider=provider)
    try:
        assert engine_saw(proxy, [("traceparent", parent), ("tracestate", "vendor=1")]) == {}
    finally:
        if provider is not None:
            provider.shutdown()


def test_valid_trace_context_reaches_the_engine_and_a_bad_tracestate_alone_is_dropped(
    stack: Callable[..., Stack],
) -> None:
    proxy = stack()
    future = f"01-{TRACE}-{PARENT}-01-future"
    state = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert engine_saw(proxy, [("traceparent", VALID), ("tracestate", state)]) == {
        "traceparent": VALID, "tracestate": state}  # fmt: skip
    assert engine_saw(proxy, [("traceparent", future)]) == {"traceparent": future}
    for bad_state in BROKEN_STATES:
        saw = engine_saw(proxy, [("traceparent", VALID), ("tracestate", bad_state)])
        assert saw == {"traceparent": VALID}, bad_state
    other = f"00-{'c' * 32}-{PARENT}-01"
    twice = engine_saw(proxy, [("traceparent", VALID), ("traceparent", other)])
    assert twice == {}, "two traceparents: the W3C rule says neither is the parent"


def test_a_callers_sampled_flag_is_held_to_the_ratio_when_asked(
    otlp: Receiver, stack: Callable[..., Stack]
) -> None:
    """By default a caller that sets sampled on every request records every one (the
    OpenTelemetry ParentBased sampler); ``caller_sampling="ratio"`` caps it at the ratio."""
    options = tracing.TraceOptions(otlp.url, 0.0, caller_sampling="ratio")
    provider = tracing.provider("inferwatch-proxy", options)
    assert provider is not None
    proxy = stack(tracer_provider=provider)
    try:
        forced = "e" * 32
        saw = engine_saw(proxy, [("traceparent", f"00-{forced}-{PARENT}-01")])
        assert saw["traceparent"].split("-")[1] == forced, "the trace still goes on to the engine"
        assert provider.force_flush()
        assert otlp.spans == []  # nothing recorded, though the caller said sampled
    finally:
        provider.shutdown()


def test_caller_sampling_is_an_option_with_an_env_twin() -> None:
    result = CliRunner().invoke(main, ["proxy", "--help"], terminal_width=200)
    assert "--otlp-caller-sampling [follow|ratio]" in result.output
    assert "INFERWATCH_PROXY_OTLP_CALLER_SAMPLING" in result.output


#: the hung export's own timeout, past the shutdown's bound: the export that shutdown gives up
#: on ends within the test, not during a later one (each attempt of the exporter draws its
#: backoff from ``random``, which a property test running meanwhile reports as its own use)
HUNG_EXPORT_TIMEOUT_S = 3.0


def test_a_hung_collector_holds_shutdown_only_as_long_as_its_bound() -> None:
    """A collector that accepts and never answers held the exporter's own timeout (10 s)
    and its retries past any drain grace: shutdown now gives up at its bound."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    bound = 1.0

    def exporter(url: str) -> OTLPSpanExporter:
        return OTLPSpanExporter(endpoint=url, timeout=HUNG_EXPORT_TIMEOUT_S)

    with hung_collector() as collector:
        options = tracing.TraceOptions(collector.url, 1.0, shutdown_s=bound)
        provider = tracing.provider("inferwatch-proxy", options, exporter=exporter)
        assert provider is not None
        provider.get_tracer("t").start_span("request").end()
        done = threading.Event()
        started = time.monotonic()
        threading.Thread(target=lambda: (provider.shutdown(), done.set()), daemon=True).start()
        assert collector.accepted.wait(10), "the exporter sent the span to the collector"
        wait_for(done.is_set, "shutdown to give up at its bound", bound + 2)
        took = time.monotonic() - started
    # the export given up on ends with its own timeout, and the shutdown behind it
    wait_for(lambda: "inferwatch-trace-shutdown" not in {t.name for t in threading.enumerate()},
             "the given-up export to end", HUNG_EXPORT_TIMEOUT_S + 5)  # fmt: skip
    print(f"shutdown with a hung collector: {took:.2f} s (bound {bound:g} s)")
