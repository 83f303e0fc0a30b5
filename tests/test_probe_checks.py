"""Degeneracy detectors, answer/structure checks and the live-traffic sampler."""

from __future__ import annotations

import random

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.probes import checks, degeneracy, golden, scoring
from inferwatch.probes.livesample import DegeneracySampler
from inferwatch.probes.reply import Reply, ToolCall
from support.shared import shared_path

pytestmark = pytest.mark.unit

LATIN = frozenset({"latin"})
HANDBOOK = next(g for g in golden.load().probes if "long-prefix" in g.tags).messages[0]["content"]
#: long healthy English technical prose: the project's research notes, read in place
REFERENCE = shared_path("reference/tenancy-routing-probes.md")


@pytest.mark.parametrize(
    ("text", "signal"),
    [
        ("", "empty"),
        ("  \n\t", "empty"),
        ("42" * 32, "repetition"),
        ("the answer is " * 12, "repetition"),
        (HANDBOOK[:600] * 5, "repetition"),
        ("Paris ปารีส เป็น เมือง", "wrong_script"),
        ("42 这", "wrong_script"),
        ("это ответ на ваш вопрос", "wrong_script"),
    ],
)
def test_degenerate_text_fires_its_signal(text: str, signal: str) -> None:
    assert signal in degeneracy.detect(text, allowed=LATIN)


@pytest.mark.parametrize(
    "text",
    [
        HANDBOOK,
        "Paris",
        "42",
        "The capital of France is Paris. It lies on the Seine.",
        "| a | b |\n|---|---|---|---|---|---|---|---|---|---|",
        "Café Müller, naïve façade",  # accented Latin is Latin
    ],
)
def test_healthy_text_fires_nothing(text: str) -> None:
    assert degeneracy.detect(text, allowed=LATIN) == frozenset()


def test_long_healthy_prose_is_not_a_repetition_loop() -> None:
    prose = REFERENCE.read_text(encoding="utf-8")
    assert len(prose) > degeneracy.MAX_CHARS
    assert not degeneracy.is_repetitive(prose)


def test_scripts_of_the_prompt_are_allowed() -> None:
    allowed = degeneracy.allowed_scripts("日本の首都はどこですか")
    assert {"han", "hiragana", "katakana", "latin"} == allowed
    assert degeneracy.detect("東京です。トウキョウ", allowed=allowed) == frozenset()
    assert degeneracy.allowed_scripts("三加四等于几") == {"han", "latin"}


def test_length_json_and_tool_calls() -> None:
    assert "finish_length" in degeneracy.detect("4", finish_reason="length")
    assert "runaway" in degeneracy.detect("x y " * 40, max_chars=20)
    assert "invalid_json" in degeneracy.detect('{"a": 1', expect_json=True)
    assert degeneracy.detect('```json\n{"a": 1}\n```', expect_json=True) == frozenset()
    assert degeneracy.detect("", has_tool_call=True) == frozenset()


def test_normalize_and_numbers() -> None:
    assert checks.normalize(' **"Paris."** ') == "paris"
    assert checks.normalize("H₂O") == checks.normalize("h2o")
    assert checks.last_number("17 + 25 = 42.") == 42
    assert checks.last_number("about 1,234.5 units") == 1234.5
    assert checks.last_number("none") is None


def _probe(probe_id: str) -> golden.Golden:
    return next(g for g in golden.load().probes if g.id == probe_id)


@pytest.mark.parametrize(
    ("probe_id", "content", "failed"),
    [
        ("arith-add", "The answer is 42.", None),
        ("arith-add", "43", "numeric"),
        ("capital-france", "paris", None),
        ("capital-france", "Lyon", "exact"),
        ("uppercase", "hello world", "regex"),
        ("json-person", '{"name": "maria lopez", "age": 34}', None),
        ("json-person", '{"name": "Maria Lopez", "age": "34"}', "json"),
        ("json-person", '{"name": "Maria Lopez", "age": 35}', "json"),
        ("json-person", "Maria Lopez, 34", "invalid_json"),
        ("json-order", '{"item": "boxes of green tea", "quantity": 3, "unit_price": 4.50}', None),
        ("short-summary", "An unbounded cache exhausted memory; it is now capped at 1 GB.", None),
        ("short-summary", "Cache.", "similarity"),
        ("ja-capital", "東京", None),
        ("ja-capital", "Tokyo", "exact"),
    ],
)
def test_answer_checks(probe_id: str, content: str, failed: str | None) -> None:
    outcome = scoring.score(
        _probe(probe_id), Reply(status=200, content=content, finish_reason="stop", total_s=0.1)
    )
    assert (None if outcome.passed else next(iter(outcome.failures))) == failed, outcome.failures


@pytest.mark.parametrize(
    ("calls", "failed"),
    [
        ((ToolCall("get_weather", '{"city": "paris", "unit": "celsius"}'),), None),
        ((), "empty"),
        ((ToolCall("get_time", '{"city": "Paris"}'),), "tool_call"),
        ((ToolCall("get_weather", '{"town": "Paris"}'),), "tool_call"),
        ((ToolCall("get_weather", '{"city": "Paris", "unit": "kelvin"}'),), "tool_call"),
        ((ToolCall("get_weather", '{"city": "Lyon"}'),), "tool_call"),
        ((ToolCall("get_weather", "{city"),), "tool_call"),
    ],
)
def test_tool_call_shape(calls: tuple[ToolCall, ...], failed: str | None) -> None:
    reply = Reply(status=200, tool_calls=calls, finish_reason="tool_calls", total_s=0.1)
    outcome = scoring.score(_probe("tool-weather"), reply)
    assert (None if outcome.passed else next(iter(outcome.failures))) == failed, outcome.failures


def test_stages_stop_at_the_first_failure() -> None:
    probe = _probe("arith-add")
    assert scoring.score(probe, Reply(error="timeout")).failures == {"transport": "timeout"}
    slow = Reply(status=200, content="42", ttft_s=12.0, total_s=13.0, finish_reason="stop")
    assert scoring.score(probe, slow).stage == "transport"
    looping = Reply(status=200, content="43" * 60, finish_reason="length")
    outcome = scoring.score(probe, looping)
    assert outcome.stage == "degeneracy" and "numeric" not in outcome.failures
    assert {"repetition", "finish_length", "runaway"} <= set(outcome.failures)


def test_sampler_counts_signals_per_model_version_without_content() -> None:
    sampler = DegeneracySampler(rate=1.0, rng=random.Random(1))
    assert sampler.should_sample()
    sampler.observe("m", "v1", "What is the capital of France?", "Paris is the capital.")
    sampler.observe("m", "v1", "What is the capital of France?", "ปารีส ปารีส เมืองหลวง")
    sampler.observe("m", "v2", "Say something", "")
    assert sampler.observe("m", "v2", "Tell me", "la " * 50) == {"repetition"}

    class Registry:
        def collect(self):  # type: ignore[no-untyped-def]
            return sampler.families()

    text = generate_latest(Registry()).decode()  # type: ignore[arg-type]
    assert "ปารีส" not in text and "Paris" not in text
    values = {
        (s.name, s.labels.get("model_version"), s.labels.get("signal")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values[("inferwatch_quality_sampled_outputs_total", "v1", None)] == 2
    assert values[("inferwatch_quality_degenerate_outputs_total", "v1", "wrong_script")] == 1
    assert values[("inferwatch_quality_degenerate_outputs_total", "v1", "empty")] == 0
    assert values[("inferwatch_quality_degenerate_outputs_total", "v2", "empty")] == 1
    assert values[("inferwatch_quality_degenerate_outputs_total", "v2", "repetition")] == 1


def test_sampler_rate_is_respected() -> None:
    sampler = DegeneracySampler(rate=0.1, rng=random.Random(7))
    hits = sum(sampler.should_sample() for _ in range(10_000))
    assert 800 < hits < 1200
    with pytest.raises(ValueError, match="between 0 and 1"):
        DegeneracySampler(rate=2)
