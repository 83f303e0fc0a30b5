"""Engine adapters: map an engine's /metrics page onto the catalogue's engine signals.

The catalogue says how each engine spells each signal; ``mapping`` reads those spellings off
a parsed page; the module of each engine holds only what is particular to it (its model
label, its rank labels, the signals it yields through arithmetic, its version endpoint).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping

import httpx
from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.exporters.engine.adapters import (
    llamacpp,
    mapping,
    settings,
    sglang,
    tgi,
    triton,
    vllm,
)
from inferwatch.exporters.engine.adapters.adapter import Adapter, Derivation, SettingSource
from inferwatch.serving.page_fetch import ScrapeFailure, read_bounded
from inferwatch.serving.textformat import Exposition

#: the most a version document may hold (they are a few hundred bytes)
VERSION_MAX_BYTES = 64 * 1024

_ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter
    for adapter in (
        vllm.ADAPTER,
        sglang.ADAPTER,
        tgi.ADAPTER,
        llamacpp.ADAPTER,
        triton.ADAPTER,
    )
}
#: the engines the sidecar reads, in the adapters' order: every list of engines derives from it
ENGINES: tuple[str, ...] = tuple(_ADAPTERS)

#: family-name prefixes (``:`` read as ``_``) that identify an engine, checked in this order.
#: TensorRT-LLM's gauges come first and Triton's core families last because Triton's vLLM
#: backend re-exports ``vllm:`` families next to ``nv_inference_*``: that page is read as
#: vLLM's, which it mostly is.
DETECTION_RULES: tuple[tuple[str, str], ...] = (
    ("nv_trt_llm_", "triton"),
    ("vllm_", "vllm"),
    ("sglang_", "sglang"),
    ("tgi_", "tgi"),
    ("llamacpp_", "llamacpp"),
    ("nv_inference_", "triton"),
)


def detect(exposition: Exposition) -> str | None:
    """The engine that served this page, or None when no known engine's families are on it."""
    names = [name.replace(":", "_") for name in exposition.families]
    for prefix, engine in DETECTION_RULES:
        if any(name.startswith(prefix) for name in names):
            return engine
    return None


def normalize(exposition: Exposition, engine: str, identity: Mapping[str, str]) -> list[Metric]:
    """Catalogue families for every engine signal this page has data for, in catalogue order.

    A signal the page lacks yields no family (absent, not zero). ``identity`` gives the
    catalogue's engine identity labels (missing ones are ""). Its ``model`` (and Triton's
    ``model_version``) applies only to samples without a model label of their own, and on a
    vLLM or SGLang page that names exactly one model, those samples take that model. An
    engine hosted in another server (vLLM as a Triton backend) has its identity read from
    that server's labels, when the engine's samples carry them.
    """
    return _plan(engine, hosted_in(exposition, engine)).run(exposition, identity)


def hosted_in(exposition: Exposition, engine: str) -> str | None:
    """The server this engine's page was served by when it is not the engine's own, else None.

    Told by the labels of the engine's own samples: the first family the adapter reads whose
    samples carry identity labels names the labelling, the engine's (``model_name``) or a
    host's (Triton's ``model`` and ``version``).
    """
    adapter = _adapter(engine)
    if not adapter.hosts:
        return None
    own = frozenset(adapter.identity_labels.values())
    reads = wanted(engine)
    for name, family in exposition.families.items():
        if not family.samples or not reads(name):
            continue
        labels = family.samples[0].labels
        if not own.isdisjoint(labels):
            return None
        for host in adapter.hosts:
            if all(label in labels for label in host.identity_labels.values()):
                return host.name
    return None


@functools.cache
def wanted(engine: str) -> Callable[[str], bool]:
    """Family-name filter for ``textformat.parse(wanted=...)``: the families ``normalize``
    reads on this engine's pages (with the engine known, the rest need not be parsed)."""
    reads = _plan(engine).family_filter()
    told = settings.page_families(_adapter(engine))
    if not told:
        return reads
    return lambda name: reads(name) or mapping.fold(name) in told


def derivations(engine: str) -> Mapping[str, Derivation | tuple[Derivation, ...]]:
    """The signals this engine yields only through arithmetic, by catalogue key (for docs)."""
    return _adapter(engine).derived


def signals(engine: str) -> frozenset[str]:
    """Catalogue keys this engine's pages and endpoints can feed, through aliases,
    derivations or the settings it tells."""
    keys = frozenset(step.spec.key for step in _plan(engine).steps)
    return keys | {"engine_setting"} if _adapter(engine).settings else keys


def page_settings(exposition: Exposition, engine: str) -> tuple[dict[str, float], int]:
    """The settings this engine's page tells, and how many label values were garbage."""
    return settings.from_page(exposition, _adapter(engine))


def told_settings(engine: str) -> Mapping[str, tuple[SettingSource, ...]]:
    """Where this engine tells each setting it tells (for docs)."""
    return _adapter(engine).settings


@functools.cache
def _plan(engine: str, host: str | None = None) -> mapping.Plan:
    adapter = _adapter(engine)
    hosts = {h.name: h for h in adapter.hosts}
    return mapping.plan(catalog.load(), adapter, None if host is None else hosts[host])


def _adapter(engine: str) -> Adapter:
    try:
        return _ADAPTERS[engine]
    except KeyError:
        raise ValueError(
            f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}"
        ) from None


async def read_version(client: httpx.AsyncClient, base_url: str, engine: str) -> dict[str, str]:
    """``engine_version`` and ``model`` from the engine's info endpoint; {} when unavailable.

    Best effort: a missing endpoint, an error status, a body that is not a JSON object (or
    is over ``VERSION_MAX_BYTES`` once inflated) or a connection failure all give {};
    endpoints are tried in the adapter's order.
    """
    known = _ADAPTERS.get(engine)
    if known is None:
        return {}
    for endpoint in known.version_endpoints:
        document = await _document(client, base_url, endpoint.path)
        if isinstance(document, dict):
            found = _fields(document, endpoint.fields)
            if found:
                return found
    return {}


async def read_settings(
    client: httpx.AsyncClient, base_url: str, engine: str
) -> tuple[dict[str, float], int]:
    """The settings the engine's JSON endpoints tell, and how many of their fields were
    garbage (:mod:`settings`); an endpoint that does not answer tells nothing."""
    known = _ADAPTERS.get(engine)
    if known is None:
        return {}, 0
    documents = {}
    for path in settings.endpoints(known):
        document = await _document(client, base_url, path)
        if document is not None:
            documents[path] = document
    return settings.from_documents(documents, known)


async def _document(client: httpx.AsyncClient, base_url: str, path: str) -> object | None:
    """The JSON document at ``path``: None for an error status, a body over
    ``VERSION_MAX_BYTES`` once inflated, one that is not JSON, or no answer."""
    try:
        async with client.stream("GET", base_url.rstrip("/") + path) as response:
            if response.status_code != 200:
                return None
            document: object = json.loads(await read_bounded(response, VERSION_MAX_BYTES))
    except (httpx.HTTPError, httpx.InvalidURL, ScrapeFailure, ValueError, RecursionError):
        return None
    return document


def _fields(
    document: Mapping[str, object], fields: Mapping[str, tuple[str, ...]]
) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, names in fields.items():
        for name in names:
            value = document.get(name)
            if isinstance(value, (str, int, float)) and not isinstance(value, bool) and value != "":
                found[key] = str(value)
                break
    return found
