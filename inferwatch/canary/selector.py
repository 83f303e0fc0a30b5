"""The ``--baseline`` and ``--candidate`` label selectors.

A selector is a PromQL label matcher list, with or without braces:
``model_version="2024-09-25"`` or ``{model="llama-8b", prompt_version=~"v2.*"}``. Only the
identity labels a rollout changes are accepted, and at least one version label must be
named: a selector on ``model`` alone compares a model with itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferwatch.mixin.promql import quoted

VERSION_LABELS = ("model_version", "engine_version", "prompt_version")
#: labels a selector may name (the model, and what a rollout changes)
LABELS = ("model", *VERSION_LABELS, "split")
MAX_SELECTOR_CHARS = 1024
_MATCHER = re.compile(
    r'\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*'
)
_ESCAPE = re.compile(r"\\(.)")


class SelectorError(ValueError):
    """A selector that cannot be used (one line, for the CLI)."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def promql(self) -> str:
        return f"{self.label}{self.op}{quoted(self.value)}"


@dataclass(frozen=True)
class Selector:
    matchers: tuple[Matcher, ...]

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(m.label for m in self.matchers)

    def promql(self) -> str:
        """The matchers as PromQL text, without braces, to add to a selector."""
        return ",".join(m.promql() for m in self.matchers)

    def __str__(self) -> str:
        return "{" + self.promql() + "}"


def parse(text: str, what: str = "selector") -> Selector:
    """A :class:`Selector` from user text; :class:`SelectorError` says what is wrong."""
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"{what}: longer than {MAX_SELECTOR_CHARS} characters")
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    matchers: list[Matcher] = []
    position = 0
    while position < len(body):
        match = _MATCHER.match(body, position)
        if match is None:
            raise SelectorError(
                f'{what}: cannot read {body[position:][:40]!r}; expected label="value", ...'
            )
        label, op = match["label"], match["op"]
        if label not in LABELS:
            raise SelectorError(f"{what}: label {label!r} is not one of {', '.join(LABELS)}")
        value = _ESCAPE.sub(r"\1", match["value"])
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise SelectorError(f"{what}: {label}{op}: bad regex ({exc})") from None
        matchers.append(Matcher(label, op, value))
        position = match.end()
        if position < len(body):
            if body[position] != ",":
                raise SelectorError(f"{what}: expected ',' after {label}{op}{quoted(value)}")
            position += 1
    if not matchers:
        raise SelectorError(f"{what}: no label matchers")
    if not any(m.label in VERSION_LABELS and m.op in ("=", "=~") for m in matchers):
        raise SelectorError(
            f"{what}: name at least one of {', '.join(VERSION_LABELS)} with = or =~"
        )
    if len({m.label for m in matchers}) != len(matchers):
        raise SelectorError(f"{what}: a label is named twice")
    return Selector(tuple(matchers))
