"""Which engine routes the proxy meters, refuses or passes through, decided on one spelling.

An engine serves more than the three OpenAI routes the proxy meters. The routes below make
vLLM, SGLang, TGI or TEI generate or embed tokens (read from their routers: vLLM's OpenAI
server, SGLang's ``http_server.py``, TGI's ``router/src/server.rs`` and TEI's router); the
proxy cannot meter their replies, so they are refused with a reason rather than passed on
unmetered. Any other route is refused too unless the pass-through allow-list names its
method and path; by default that is the read-only GETs for health, models, version and
metrics.

The request target is normalised once, before routing, and the normalised path is what the
engine receives: percent-escapes decoded, empty and ``.`` segments dropped, ``..`` resolved,
no trailing slash, the method in upper case. So ``//v1/chat/completions/``,
``/v1/chat/%63ompletions`` or ``/v1/x/../chat/completions`` is metered as chat, and no
spelling reaches an engine route the proxy did not decide on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, unquote_to_bytes

Kind = Literal["metered", "unmetered", "passthrough", "refused", "own"]

#: POST routes the proxy meters (OpenAI request and usage schema), and what they are.
METERED = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
STREAMABLE = frozenset({"/v1/chat/completions", "/v1/completions"})

#: Routes that make an engine generate, embed or score tokens in a schema the proxy does not
#: meter. Matched on the path whatever the method; a trailing ``/`` entry is a prefix.
GENERATING = (
    # vLLM (OpenAI server): Responses, Anthropic Messages, pooling, scoring, audio, SageMaker
    "/v1/responses/",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/",
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/audio/",
    "/invocations",
    "/inference/v1/generate",
    # SGLang
    "/generate",
    "/encode",
    "/health_generate",
    # TGI (`/` is compat_generate when POSTed) and TEI
    "/generate_stream",
    "/vertex",
    "/embed",
    "/embed_all",
    "/embed_sparse",
    "/predict",
    "/similarity",
)

#: Served by the proxy itself on the client port.
OWN = frozenset({"/healthz", "/readyz"})

DEFAULT_PASSTHROUGH = (
    "GET /health",
    "GET /ping",
    "GET /v1/models",
    "GET /version",
    "GET /info",
    "GET /metrics",
)


_SAFE = "/:@!$&'()*+,;=-_~"
#: a path that normalising leaves as it is: segments of plain characters, no dot segments
_CANONICAL = re.compile(rb"(?:/(?!\.\.?(?:/|$))[A-Za-z0-9:@!$&'()*+,;=\-._~]+)+|/")


class BadTarget(ValueError):
    """A request target that is not a path (or decodes to one with control characters)."""


@dataclass(frozen=True, slots=True)
class Route:
    kind: Kind
    method: str
    path: str  # normalised
    #: what goes to the engine: the normalised path, re-escaped, plus the query as sent
    target: bytes


def normalise_path(raw: bytes) -> str:
    """The one spelling of a raw request path (see the module docstring)."""
    if not raw.startswith(b"/"):
        raise BadTarget("request target must be an absolute path")
    try:
        decoded = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise BadTarget("request path is not UTF-8 once percent-decoded") from None
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in decoded):
        raise BadTarget("request path holds control characters")
    segments: list[str] = []
    for segment in decoded.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    return "/" + "/".join(segments)


def parse_entries(entries: Iterable[str]) -> frozenset[tuple[str, str]]:
    """``"METHOD /path"`` allow-list entries as normalised (method, path) pairs."""
    out = set()
    for entry in entries:
        method, _, path = entry.strip().partition(" ")
        path = path.strip()
        if not method.isalpha() or not path.startswith("/"):
            raise ValueError(f"expected 'METHOD /path', got {entry!r}")
        normal = normalise_path(path.encode())
        if normal in METERED or _generating(normal) or (normal == "/" and method.upper() == "POST"):
            raise ValueError(f"{entry!r} makes the engine generate: it cannot pass unmetered")
        out.add((method.upper(), normal))
    return frozenset(out)


def _generating(path: str) -> bool:
    return any(
        path.startswith(entry) if entry.endswith("/") else path == entry for entry in GENERATING
    )


class Router:
    def __init__(self, passthrough: Iterable[str] = DEFAULT_PASSTHROUGH) -> None:
        self.passthrough = parse_entries(passthrough)

    def route(self, method: str, raw_path: bytes, query: bytes) -> Route:
        """Classify one request; raises ``BadTarget`` for a path that cannot be normalised."""
        method = method.upper()
        if _CANONICAL.fullmatch(raw_path):  # the usual case: already the one spelling
            path, target = raw_path.decode("ascii"), raw_path
        else:
            path = normalise_path(raw_path)
            target = quote(path, safe=_SAFE).encode()
        if query:
            target += b"?" + query
        kind: Kind
        if path in OWN and method in ("GET", "HEAD"):
            kind = "own"
        elif path in METERED and method == "POST":
            kind = "metered"
        elif path in METERED or _generating(path) or (path == "/" and method == "POST"):
            kind = "unmetered"
        elif (method, path) in self.passthrough:
            kind = "passthrough"
        else:
            kind = "refused"
        return Route(kind, method, path, target)
