"""A local OTLP/HTTP trace receiver: what a collector would get, decoded with
``opentelemetry-proto``, so that tests read the spans the real exporter sent.

``Receiver`` serves ``POST /v1/traces`` (protobuf ``ExportTraceServiceRequest``) on a loopback
port in a thread; ``spans`` holds every span received, flattened with its resource's
attributes, and ``wait_for_span`` waits (with a deadline) for one that matches.
``Span.events`` are the names of its events, in order. ``hung_collector`` accepts
connections and never answers, as a collector stuck behind a full pipeline does.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from support.wait import wait_for


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: list[str]
    status_code: int


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver._take(self.path, body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    def _take(self, path: str, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        Span(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            resource=resource,
                            events=[event.name for event in span.events],
                            status_code=span.status.code,
                        )
                    )
        with self._lock:
            self.paths.append(path)
            self.spans.extend(spans)

    def wait_for_span(
        self, match: Callable[[Span], bool], what: str, flush: Callable[[], object]
    ) -> Span:
        """The first span received that ``match``es; ``flush`` pushes out batched spans."""

        def found() -> Span | None:
            flush()
            with self._lock:
                return next((span for span in self.spans if match(span)), None)

        span: Span = wait_for(found, what)
        return span

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextmanager
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    try:
        yield running
    finally:
        running.close()


class HungCollector:
    """Listens on loopback, accepts every connection and never answers it (the request waits
    in the socket's buffer); ``accepted`` is set once an exporter has connected."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.accepted = threading.Event()
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # shut down
            with self._lock:
                if self._closed:
                    connection.close()
                    return
                self._held.append(connection)
            self.accepted.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for connection in self._held:
                connection.close()
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._listener.close()
        self._thread.join(5)


@contextmanager
def hung_collector() -> Iterator[HungCollector]:
    running = HungCollector()
    try:
        yield running
    finally:
        running.close()
