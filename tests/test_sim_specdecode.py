"""The simulator's speculative decoding: vLLM's spec-decode series and the invariants they keep."""

from __future__ import annotations

import itertools
import random

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.sim.server import run_in_thread
from inferwatch.sim.simulator import SimConfig
from inferwatch.sim.specdecode import Drafter, Speculation
from support.shared import shared_path

pytestmark = pytest.mark.unit

SPECDEC_FIXTURE = shared_path("fixtures/engines/vllm-generated-0.33.0-specdec-lora.prom")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"

workloads = st.lists(
    st.tuples(st.integers(0, 64), st.floats(0.0, 1.0)), min_size=1, max_size=20
)  # (decoding requests, batch fill) per step


def run(k: int, acceptance: float, steps: list[tuple[int, float]], seed: int) -> list[Speculation]:
    drafter = Drafter(k, acceptance, random.Random(seed))
    return [drafter.step(drafts, fill) for drafts, fill in steps]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.floats(0.0, 1.0), workloads, st.integers(0, 2**16))
def test_accepted_tokens_never_exceed_the_draft(
    k: int, acceptance: float, steps: list[tuple[int, float]], seed: int
) -> None:
    for (drafts, _), step in zip(steps, run(k, acceptance, steps, seed), strict=True):
        assert step.drafts == drafts
        assert step.draft_tokens == k * drafts
        per_position = step.accepted_per_position
        assert len(per_position) == k
        assert step.accepted == sum(per_position) <= step.draft_tokens
        assert all(0 <= count <= drafts for count in per_position)
        # a draft is accepted as a prefix: position i is kept only where i - 1 was
        assert all(deeper <= shallower for shallower, deeper in itertools.pairwise(per_position))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 8),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    workloads,
    st.floats(0.0, 1.0),
    st.integers(0, 2**16),
)
def test_a_worse_draft_or_a_fuller_batch_accepts_no_more(
    k: int,
    better: float,
    worse_share: float,
    steps: list[tuple[int, float]],
    extra_fill: float,
    seed: int,
) -> None:
    base = run(k, better, steps, seed)
    worse = run(k, better * worse_share, steps, seed)
    fuller = run(k, better, [(d, min(1.0, f + extra_fill)) for d, f in steps], seed)
    for ours, theirs in ((base, worse), (base, fuller)):
        for a, b in zip(ours, theirs, strict=True):
            assert all(
                x >= y
                for x, y in zip(a.accepted_per_position, b.accepted_per_position, strict=True)
            )


def test_acceptance_falls_with_depth_and_load() -> None:
    drafter = Drafter(3, 0.8, random.Random(0))
    idle = [drafter.probability(position, 0.0) for position in range(3)]
    full = [drafter.probability(position, 1.0) for position in range(3)]
    assert idle[0] == 0.8
    assert idle[0] > idle[1] > idle[2]
    assert all(f < i for f, i in zip(full, idle, strict=True))


def families(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            out.setdefault(sample.name, {})[labels] = sample.value
    return out


def total(page: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> float:
    return sum(page.get(name, {}).values())


def test_a_speculating_replica_serves_vllms_spec_decode_series() -> None:
    config = SimConfig(port=0, speed=50, num_speculative_tokens=3, draft_acceptance=0.7)
    with run_in_thread(config) as sim:
        body = {"model": MODEL, "max_tokens": 24, "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):
            assert httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).is_success
        text = httpx.get(sim.url + "/metrics").text
    real = SPECDEC_FIXTURE.read_text(encoding="utf-8")
    ours_types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE vllm:")]
    real_types = [line.split()[2] for line in real.splitlines() if line.startswith("# TYPE vllm:")]
    spec = [name for name in real_types if name.startswith("vllm:spec_decode_")]
    # vLLM registers them first, before the estimated-flops family
    assert ours_types[: len(spec)] == spec
    page = families(text)
    real_labels = {
        labels for labels in families(real)["vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    }
    positions = {dict(labels)["position"] for labels in real_labels}
    ours_positions = {
        dict(labels)["position"]
        for labels in page["vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    }
    assert ours_positions == positions == {"0", "1", "2"}
    drafts = total(page, "vllm:spec_decode_num_drafts_total")
    # one draft per decode step of each request: every token after the first
    assert drafts == total(page, "vllm:inter_token_latency_seconds_count") > 0
    assert total(page, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
    accepted = total(page, "vllm:spec_decode_num_accepted_tokens_total")
    per_pos = total(page, "vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert 0 < accepted == per_pos <= 3 * drafts


def test_speculative_decoding_is_off_by_default() -> None:
    with run_in_thread(SimConfig(port=0, speed=50)) as sim:
        text = httpx.get(sim.url + "/metrics").text
    assert "spec_decode" not in text
