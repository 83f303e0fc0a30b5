"""Reconciliation: do the tokens the proxy charged match the engine's own counters?

The engine counts every prompt and generated token it processes (vLLM
``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``, SGLang the same names under
``sglang:``, llama.cpp ``llamacpp:tokens_predicted_total`` and its prompt tokens as
``llamacpp:prompt_tokens_total``, computed, plus ``llamacpp:prompt_tokens_cached_total``, taken
from its cache: together what its usage reports). From the first successful read, the growth of
those counters is compared with the growth of what the proxy charged plus the known traffic
that reaches the engine around the proxy: quality probes sent straight to the engine (the
sidecar's ``--probes``, or ``inferwatch probe --target``), read from their runner's
``inferwatch_probe_tokens_total`` with ``route="direct"``, and the sidecar's warm-up requests
(``inferwatch_warmup_tokens_total``). The difference is published as a drift gauge. It settles
at zero when accounting is exact; unknown traffic that bypasses the proxy, lost charges or
double counting all show up as drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from inferwatch.proxy.usage import Usage
from inferwatch.serving import textformat

# sample names with ':' read as '_' and without '_total'
ENGINE_COUNTERS = {
    "prompt": (
        "vllm_prompt_tokens",
        "sglang_prompt_tokens",
        "llamacpp_prompt_tokens",
        "llamacpp_prompt_tokens_cached",
    ),
    "completion": (
        "vllm_generation_tokens",
        "sglang_generation_tokens",
        "llamacpp_tokens_predicted",
    ),
}
_WANTED = {name for names in ENGINE_COUNTERS.values() for name in names}


def engine_token_counters(page: bytes | str) -> dict[str, float] | None:
    """Prompt and completion token totals from an engine's /metrics page, summed over ranks.

    None when the page has neither counter (not an engine this knows, or not metrics).
    """
    exposition = textformat.parse(
        page, wanted=lambda name: name.replace(":", "_").removesuffix("_total") in _WANTED
    )
    totals: dict[str, float] = {}
    for family in exposition.families.values():
        for sample in family.samples:
            name = sample.name.replace(":", "_")
            if not name.endswith("_total"):
                continue
            stem = name.removesuffix("_total")
            for token_type, names in ENGINE_COUNTERS.items():
                if stem in names:
                    totals[token_type] = totals.get(token_type, 0.0) + sample.value
    return totals or None


PROBE_TOKENS = "inferwatch_probe_tokens"
WARMUP_TOKENS = "inferwatch_warmup_tokens"
_DIRECT = (PROBE_TOKENS, WARMUP_TOKENS)


def _stem(name: str) -> str:
    """A counter's name without the suffix of its samples: text format 0.0.4 writes a
    counter's creation times as a family of their own, ``<name>_created``."""
    return name.removesuffix("_total").removesuffix("_created")


@dataclass(frozen=True)
class Direct:
    """What one sidecar or probe runner sent straight to the engine, and since when: the
    creation time of its counters (their ``_created`` samples), which changes when the process
    restarts even if its new counters have already passed the old ones."""

    tokens: dict[str, float]
    started: float | None = None


def direct_tokens(page: bytes | str) -> Direct | None:
    """Prompt and completion tokens a sidecar or probe runner sent straight to an engine:
    its direct probes and its warm-up requests.

    None when the page has neither counter (not a probe runner's or sidecar's page).
    """
    exposition = textformat.parse(page, wanted=lambda name: _stem(name) in _DIRECT)
    if not exposition.families:
        return None
    totals = dict.fromkeys(ENGINE_COUNTERS, 0.0)
    started: float | None = None
    for family in exposition.families.values():
        for sample in family.samples:
            if sample.name.endswith("_created"):
                started = max(started or 0.0, sample.value)
                continue
            if not sample.name.endswith("_total"):
                continue
            token_type = sample.labels.get("type", "")
            probe = sample.name.removesuffix("_total") == PROBE_TOKENS
            if token_type in totals and (not probe or sample.labels.get("route") == "direct"):
                totals[token_type] += sample.value
    return Direct(totals, started)


class DirectTrafficError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DirectTraffic:
    """Reads the sidecars and probe runners whose requests reach this proxy's engine without
    passing it."""

    def __init__(self, urls: Sequence[str], timeout_s: float = 5.0, max_bytes: int = 8 << 20):
        self.urls = tuple(urls)
        self.max_bytes = max_bytes
        self._client = httpx.AsyncClient(timeout=timeout_s) if self.urls else None

    async def read(self) -> Direct:
        """Direct probe tokens summed over the runners, and the latest of their start times
        (a restart of any one of them moves it); raises DirectTrafficError."""
        totals = dict.fromkeys(ENGINE_COUNTERS, 0.0)
        started: float | None = None
        for url in self.urls:
            counters = direct_tokens(await self._page(url))
            if counters is None:
                raise DirectTrafficError("no_probe_counters")
            for token_type, value in counters.tokens.items():
                totals[token_type] += value
            if counters.started is not None:
                started = max(started or 0.0, counters.started)
        return Direct(totals, started)

    async def _page(self, url: str) -> bytes:
        assert self._client is not None
        body = bytearray()
        try:
            async with self._client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise DirectTrafficError("probe_http_status")
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise DirectTrafficError("probe_too_large")
        except httpx.HTTPError:
            raise DirectTrafficError("probe_unreachable") from None
        return bytes(body)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


@dataclass
class _Baseline:
    engine: dict[str, float]
    proxy: dict[str, float]
    direct: Direct


class Reconciler:
    """Keeps the baseline and turns each engine read into drift per token type."""

    def __init__(self) -> None:
        self._baseline: _Baseline | None = None

    def update(
        self, engine: dict[str, float], charged: Usage, direct: Direct | None = None
    ) -> dict[str, float]:
        """Drift since the baseline: charged + direct growth minus the engine's growth."""
        proxy = {"prompt": float(charged.prompt), "completion": float(charged.completion)}
        direct = direct or Direct(dict.fromkeys(ENGINE_COUNTERS, 0.0))
        base = self._baseline
        if (
            base is None
            or any(engine.get(k, 0.0) < v for k, v in base.engine.items())
            or any(direct.tokens.get(k, 0.0) < v for k, v in base.direct.tokens.items())
            or direct.started != base.direct.started
        ):
            # first read, or the engine or a probe runner restarted and began counting again
            base = self._baseline = _Baseline(dict(engine), proxy, direct)
        return {
            token_type: (proxy[token_type] - base.proxy[token_type])
            + (direct.tokens.get(token_type, 0.0) - base.direct.tokens.get(token_type, 0.0))
            - (engine.get(token_type, 0.0) - base.engine.get(token_type, 0.0))
            for token_type in ENGINE_COUNTERS
        }
