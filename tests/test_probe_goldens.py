"""The shipped golden sets and the loader's validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.probes import golden, scoring
from inferwatch.probes.golden import GoldenError

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "fixtures" / "probes"


def test_default_set_covers_the_required_kinds_of_prompt() -> None:
    goldens = golden.load()
    assert 20 <= len(goldens) <= 50
    tags = {tag for g in goldens.probes for tag in g.tags}
    assert {"arithmetic", "closed-qa", "json", "tool", "long-prefix", "multilingual"} <= tags
    assert any(g.tool_call is not None and g.tools for g in goldens.probes)
    shared = [g for g in goldens.probes if "long-prefix" in g.tags]
    assert len(shared) >= 2 and len({g.messages[0]["content"] for g in shared}) == 1
    assert len(shared[0].messages[0]["content"]) > 2000
    assert any(g.scripts - {"latin"} for g in goldens.probes)  # a non-Latin-script prompt


@pytest.mark.parametrize("probe", golden.load().probes, ids=lambda g: g.id)
def test_every_canonical_answer_passes_every_stage(probe: golden.Golden) -> None:
    outcome = scoring.score(probe, probe.canonical_reply())
    assert outcome.passed, outcome.failures


def test_requests_are_greedy_short_and_streamed_with_usage() -> None:
    probe = golden.load().probes[0]
    body = probe.request("m")
    assert body["temperature"] == 0 and body["max_tokens"] <= 64
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_simulator_reads_the_same_answers_by_prompt_key() -> None:
    answers = pytest.importorskip("inferwatch.sim.answers")
    book = answers.AnswerBook.from_dir(None)
    for probe in golden.load().probes:
        reply = book.answer(probe.prompt, tools_offered=bool(probe.tools), max_tokens=4096)
        if probe.tool_call is None:
            assert "".join(reply.pieces) == probe.answer, probe.id
        else:
            assert reply.tool_call is not None, probe.id
            assert reply.tool_call.name == probe.tool_call.name


def test_prompt_key_folds_width_and_whitespace() -> None:
    assert golden.prompt_key("  What\n is  \uff11\uff17?\t")  # full-width digits == "What is 17?"


INVALID = [
    ("name: x\nprobes: []\n", "`probes` is empty"),
    ("probes:\n  - {id: a, prompt: p, answer: a, check: exact}\n", "name: required"),
    ("name: x\nprobes:\n  - {id: A, prompt: p, answer: a, check: exact}\n", "id: required"),
    ("name: x\nprobes:\n  - {id: a, answer: a, check: exact}\n", "one of `prompt` and `messages`"),
    ("name: x\nprobes:\n  - {id: a, prompt: p, check: exact}\n", "one of `answer` and `tool_call`"),
    ("name: x\nprobes:\n  - {id: a, prompt: p, answer: 4, check: exact}\n", "quote numbers"),
    ("name: x\nprobes:\n  - {id: a, prompt: p, answer: a, check: fuzzy}\n", "unknown kind 'fuzzy'"),
    ("name: x\nprobes:\n  - {id: a, prompt: p, answer: a, check: {regex: '('}}\n", "check.regex"),
    ("name: x\nprobes:\n  - {id: a, prompt: p, answer: a, check: numeric}\n", "holds no number"),
    (
        "name: x\nprobes:\n  - {id: a, prompt: p, answer: a, check: {exact: b}}\n",
        "canonical answer fails it",
    ),
    (
        "name: x\nprobes:\n  - {id: a, prompt: p, answer: '{}',"
        " check: {json: {schema: {oneOf: []}}}}\n",
        "unsupported keywords ['oneOf']",
    ),
    (
        "name: x\nprobes:\n  - {id: a, prompt: p, answer: a, check: exact, colour: red}\n",
        "unknown fields ['colour']",
    ),
    (
        "name: x\nprobes:\n  - {id: a, prompt: p, answer: a, check: exact}\n"
        "  - {id: b, prompt: ' p ', answer: a, check: exact}\n",
        "share a last user message",
    ),
    (
        "name: x\nprobes:\n  - {id: a, prompt: p, tool_call: {name: f}, check: tool_call}\n",
        "'f' is not among `tools`",
    ),
    ("name: x\nprobes: [\n", "line 3: invalid YAML"),
]


@pytest.mark.parametrize(("text", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_sets_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(GoldenError, match=None) as info:
        golden.parse(text, "bad.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("bad.yaml")
    assert "\n" not in str(info.value)


def test_errors_carry_the_line_of_the_probe(tmp_path: Path) -> None:
    path = tmp_path / "set.yaml"
    path.write_text(
        "name: x\nprobes:\n  - {id: a, prompt: p, answer: a, check: exact}\n"
        "  - id: b\n    prompt: q\n    answer: a\n    check: {numeric: {tolerance: x}}\n"
    )
    with pytest.raises(GoldenError, match=r"set.yaml:4: probes\[1\] \(b\): check.numeric"):
        golden.load(str(path))


def test_unknown_set_lists_the_shipped_ones() -> None:
    with pytest.raises(GoldenError, match="shipped: default"):
        golden.load("no-such-set")


def test_a_custom_set_file_loads() -> None:
    goldens = golden.load(str(FIXTURES / "tiny.yaml"))
    assert goldens.name == "tiny" and [g.id for g in goldens.probes] == ["add", "capital"]
