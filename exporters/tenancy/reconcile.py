"""Reconciliation: do the tokens the proxy charged match the engine's own counters?

The engine counts every prompt and generated token it processes (vLLM
``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``, SGLang the same names under
``sglang:``). From the first successful read, the growth of those counters is compared with
the growth of what the proxy charged; the difference is published as a drift gauge. It is
zero when all traffic goes through the proxy and accounting is exact; traffic that bypasses
the proxy, lost charges or double counting all show up as drift.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.exporters import textformat
from inferwatch.exporters.tenancy.usage import Usage

# sample names with ':' read as '_' and without '_total'
ENGINE_COUNTERS = {
    "prompt": ("vllm_prompt_tokens", "sglang_prompt_tokens"),
    "completion": ("vllm_generation_tokens", "sglang_generation_tokens"),
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


@dataclass
class _Baseline:
    engine: dict[str, float]
    proxy: dict[str, float]


class Reconciler:
    """Keeps the baseline and turns each engine read into drift per token type."""

    def __init__(self) -> None:
        self._baseline: _Baseline | None = None

    def update(self, engine: dict[str, float], charged: Usage) -> dict[str, float]:
        proxy = {"prompt": float(charged.prompt), "completion": float(charged.completion)}
        base = self._baseline
        if base is None or any(engine.get(k, 0.0) < v for k, v in base.engine.items()):
            # first read, or the engine restarted and its counters began again
            base = self._baseline = _Baseline(dict(engine), proxy)
        return {
            token_type: (proxy[token_type] - base.proxy[token_type])
            - (engine.get(token_type, 0.0) - base.engine.get(token_type, 0.0))
            for token_type in ENGINE_COUNTERS
        }
