"""The sidecar's reading of a real vLLM: its page, mapped, equals vLLM's own counters."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch import identity
from inferwatch.exporters.engine import adapters as engines
from inferwatch.serving import textformat
from support.realengine import MODEL, Engines

pytestmark = pytest.mark.realengine


def _engine_counter(page: str, name: str) -> float:
    """The sum of a vLLM counter's samples (``name`` without ``_total``) on a raw page."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        if family.name == name
        for sample in family.samples
        if sample.name == f"{name}_total"
    )


def test_mapped_token_counters_equal_vllms_own(engines: Engines) -> None:
    engine = engines.vllm()
    with httpx.Client(base_url=engine.url, timeout=60) as client:
        for prompt in ("the sidecar reads", "a replica with a dead engine"):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
            reply = client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
        page = client.get("/metrics").text
    families = engines_normalized(page)
    pairs = (("inferwatch_engine_prompt_tokens", "vllm:prompt_tokens"),
             ("inferwatch_engine_generation_tokens", "vllm:generation_tokens"))  # fmt: skip
    for key, source in pairs:
        mapped = [s for s in families[key].samples if s.name.endswith("_total")]
        assert {s.labels["model"] for s in mapped} == {MODEL}
        assert sum(s.value for s in mapped) == _engine_counter(page, source) > 0


def engines_normalized(page: str) -> dict[str, object]:
    exposition = textformat.parse(page)
    assert engines.detect(exposition) == "vllm"
    labels = dict.fromkeys(identity.KEYS, "") | {"engine": "vllm"}
    return {family.name: family for family in engines.normalize(exposition, "vllm", labels)}
