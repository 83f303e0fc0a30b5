"""Structure, answer and similarity checks on one reply, built from a golden's ``check:``.

Each check kind is a small class with a ``stage`` (``structure``, ``answer`` or
``similarity``, the order in which :func:`inferwatch.probes.scoring.score` runs them) and a
``run(reply)`` that returns ``""`` when the reply passes or a short reason when it fails.
Expected values are bound when the golden set is loaded, so a bad ``check:`` fails at load
time with the probe and field in the message, never halfway through a probe cycle.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from inferwatch.probes import schema as jsonschema
from inferwatch.probes.degeneracy import parse_json
from inferwatch.probes.reply import Reply

Stage = Literal["structure", "answer", "similarity"]

_NUMBER: Final = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
# ASCII and CJK quotes and final punctuation (full-width ! and ?, curly quotes, guillemets).
_EDGE_JUNK: Final = "\"'`*_ \t\n.!?,;:\u3002\uff01\uff1f\u3001\u201c\u201d\u2018\u2019\u00ab\u00bb"


class CheckError(ValueError):
    """A ``check:`` entry that cannot be built; the message names the field."""


def normalize(text: str) -> str:
    """Case- and width-insensitive form for comparing short answers.

    NFKC (so ``H₂O`` equals ``H2O`` and full-width digits are digits), case-folded,
    whitespace collapsed, surrounding quotes, Markdown emphasis and final punctuation removed.
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(text.split()).strip(_EDGE_JUNK)


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands separators allowed), if any."""
    found = _NUMBER.findall(unicodedata.normalize("NFKC", text))
    return float(found[-1].replace(",", "")) if found else None


def trigram_dice(a: str, b: str) -> float:
    """Dice coefficient of character trigrams of the normalized texts (0..1).

    Language-agnostic (works without word boundaries) and dependency-free; a lexical
    stand-in for embedding similarity that is good enough to tell a paraphrase from noise.
    """

    def grams(text: str) -> Counter[str]:
        padded = f"  {normalize(text)}  "
        return Counter(padded[i : i + 3] for i in range(len(padded) - 2))

    left, right = grams(a), grams(b)
    total = sum(left.values()) + sum(right.values())
    return 2 * sum((left & right).values()) / total if total else 1.0


@dataclass(frozen=True)
class Expected:
    """What a golden says a correct reply is; checks take their defaults from it."""

    answer: str | None
    tool_name: str | None
    tool_arguments: Mapping[str, Any]
    tool_parameters: Mapping[str, Mapping[str, Any]]  # tool name -> parameters schema


class Check:
    kind: ClassVar[str]
    stage: ClassVar[Stage]

    def run(self, reply: Reply) -> str:
        raise NotImplementedError


def _strings(value: Any, field: str) -> tuple[str, ...]:
    values = [value] if isinstance(value, (str, int, float)) else value
    if (
        not isinstance(values, list)
        or not values
        or not all(isinstance(v, (str, int, float)) for v in values)
    ):
        raise CheckError(f"{field}: expected a string or a list of strings")
    return tuple(str(v) for v in values)


def _need_answer(expected: Expected, field: str) -> str:
    if expected.answer is None:
        raise CheckError(f"{field}: needs a value or the probe's `answer`")
    return expected.answer


class ExactCheck(Check):
    kind = "exact"
    stage = "answer"

    def __init__(self, options: Any, expected: Expected) -> None:
        accepted = (
            (_need_answer(expected, "check.exact"),)
            if options is None
            else _strings(options, "check.exact")
        )
        self.accepted = frozenset(normalize(a) for a in accepted)

    def run(self, reply: Reply) -> str:
        if normalize(reply.content) in self.accepted:
            return ""
        return f"expected {' or '.join(sorted(self.accepted))}"


class ContainsCheck(Check):
    kind = "contains"
    stage = "answer"

    def __init__(self, options: Any, expected: Expected) -> None:
        needles = (
            (_need_answer(expected, "check.contains"),)
            if options is None
            else _strings(options, "check.contains")
        )
        self.needles = tuple(normalize(n) for n in needles)

    def run(self, reply: Reply) -> str:
        text = normalize(reply.content)
        missing = [n for n in self.needles if n not in text]
        return f"missing {missing}" if missing else ""


class RegexCheck(Check):
    kind = "regex"
    stage = "answer"

    def __init__(self, options: Any, expected: Expected) -> None:
        if not isinstance(options, str):
            raise CheckError("check.regex: expected a pattern string")
        try:
            self.pattern = re.compile(options)
        except re.error as exc:
            raise CheckError(f"check.regex: {exc}") from None

    def run(self, reply: Reply) -> str:
        return "" if self.pattern.search(reply.content) else f"no match for {self.pattern.pattern}"


class NumericCheck(Check):
    kind = "numeric"
    stage = "answer"

    def __init__(self, options: Any, expected: Expected) -> None:
        options = {} if options is None else options
        if not isinstance(options, Mapping) or set(options) - {"value", "tolerance"}:
            raise CheckError("check.numeric: options are {value, tolerance}")
        value = options.get("value")
        if value is None:
            value = last_number(_need_answer(expected, "check.numeric"))
            if value is None:
                raise CheckError("check.numeric: the answer holds no number")
        tolerance = options.get("tolerance", 0)
        if not isinstance(value, (int, float)) or not isinstance(tolerance, (int, float)):
            raise CheckError("check.numeric: value and tolerance are numbers")
        self.value = float(value)
        self.tolerance = float(tolerance)

    def run(self, reply: Reply) -> str:
        got = last_number(reply.content)
        if got is not None and math.isclose(got, self.value, rel_tol=0, abs_tol=self.tolerance):
            return ""
        return f"expected {self.value:g}, got {got if got is None else format(got, 'g')}"


def _match_keys(options: Mapping[str, Any], field: str) -> Sequence[str] | None:
    """``match: all`` -> None (compare everything), a list -> those keys, absent -> ()."""
    match = options.get("match", ())
    if match == "all":
        return None
    if not isinstance(match, list) or not all(isinstance(k, str) for k in match):
        raise CheckError(f"{field}.match: expected `all` or a list of keys")
    return tuple(match)


def _same(got: Any, want: Any) -> bool:
    """Equality that forgives case and spacing in strings and int/float spelling."""
    if isinstance(want, str) and isinstance(got, str):
        return normalize(got) == normalize(want)
    if isinstance(want, dict) and isinstance(got, dict):
        return set(got) == set(want) and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    return bool(got == want) and isinstance(got, bool) == isinstance(want, bool)


def _compare(got: Any, want: Any, keys: Sequence[str] | None) -> str:
    if keys is None:
        return "" if _same(got, want) else "differs from the answer"
    wrong = [k for k in keys if not isinstance(got, dict) or not _same(got.get(k), want.get(k))]
    return f"wrong {wrong}" if wrong else ""


class JsonCheck(Check):
    kind = "json"
    stage = "structure"

    def __init__(self, options: Any, expected: Expected) -> None:
        options = {} if options is None else options
        if not isinstance(options, Mapping) or set(options) - {"schema", "match"}:
            raise CheckError("check.json: options are {schema, match}")
        self.schema: Mapping[str, Any] | None = options.get("schema")
        if self.schema is not None:
            try:
                jsonschema.check_schema(self.schema, "check.json.schema")
            except jsonschema.SchemaError as exc:
                raise CheckError(str(exc)) from None
        self.keys = _match_keys(options, "check.json")
        self.want: Any = None
        if self.keys != ():
            try:
                self.want = parse_json(_need_answer(expected, "check.json.match"))
            except ValueError:
                raise CheckError("check.json.match: the answer is not JSON") from None

    def run(self, reply: Reply) -> str:
        try:
            got = parse_json(reply.content)
        except ValueError:
            return "not JSON"
        if self.schema is not None:
            problems = jsonschema.errors(got, self.schema)
            if problems:
                return "; ".join(problems[:3])
        return _compare(got, self.want, self.keys) if self.keys != () else ""


class ToolCallCheck(Check):
    kind = "tool_call"
    stage = "structure"

    def __init__(self, options: Any, expected: Expected) -> None:
        options = {} if options is None else options
        if not isinstance(options, Mapping) or set(options) - {"name", "match"}:
            raise CheckError("check.tool_call: options are {name, match}")
        name = options.get("name", expected.tool_name)
        if not isinstance(name, str):
            raise CheckError("check.tool_call: needs `name` or the probe's `tool_call`")
        if name not in expected.tool_parameters:
            raise CheckError(f"check.tool_call: {name!r} is not among the probe's `tools`")
        self.name = name
        self.parameters = expected.tool_parameters[name]
        self.keys = _match_keys(options, "check.tool_call")
        self.want = dict(expected.tool_arguments)

    def run(self, reply: Reply) -> str:
        if len(reply.tool_calls) != 1:
            return f"expected one tool call, got {len(reply.tool_calls)}"
        call = reply.tool_calls[0]
        if call.name != self.name:
            return f"called {call.name!r}, expected {self.name!r}"
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return "arguments are not JSON"
        if not isinstance(arguments, dict):
            return "arguments are not a JSON object"
        problems = jsonschema.errors(arguments, self.parameters)
        if problems:
            return "; ".join(problems[:3])
        return _compare(arguments, self.want, self.keys) if self.keys != () else ""


class SimilarityCheck(Check):
    kind = "similarity"
    stage = "similarity"

    def __init__(self, options: Any, expected: Expected) -> None:
        if not isinstance(options, Mapping) or set(options) != {"min"}:
            raise CheckError("check.similarity: options are {min: 0..1}")
        minimum = options["min"]
        if not isinstance(minimum, (int, float)) or not 0 <= minimum <= 1:
            raise CheckError("check.similarity.min: a number from 0 to 1")
        self.minimum = float(minimum)
        self.reference = _need_answer(expected, "check.similarity")

    def run(self, reply: Reply) -> str:
        score = trigram_dice(reply.content, self.reference)
        return "" if score >= self.minimum else f"similarity {score:.2f} < {self.minimum:.2f}"


KINDS: Final[Mapping[str, Callable[[Any, Expected], Check]]] = {
    cls.kind: cls
    for cls in (
        ExactCheck,
        ContainsCheck,
        RegexCheck,
        NumericCheck,
        JsonCheck,
        ToolCallCheck,
        SimilarityCheck,
    )
}


def build(raw: Any, expected: Expected) -> tuple[Check, ...]:
    """Checks from a golden's ``check:`` value (a kind name, or a mapping of kind -> options)."""
    if isinstance(raw, str):
        raw = {raw: None}
    if not isinstance(raw, Mapping) or not raw:
        raise CheckError("check: expected a kind name or a mapping of kinds to options")
    built = []
    for kind, options in raw.items():
        if kind not in KINDS:
            raise CheckError(f"check: unknown kind {kind!r} (known: {', '.join(KINDS)})")
        built.append(KINDS[kind](options, expected))
    return tuple(built)
