"""Golden sets: prompts with a canonical answer and the checks a reply must pass.

The file format is documented at the top of ``probes/goldens/default.yaml``. Loading
validates everything (fields, check options, JSON schemas, that each canonical answer passes
its own checks), and errors name the file, line, probe and field.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from inferwatch import config as layer
from inferwatch.probes import checks, degeneracy, schema
from inferwatch.probes.reply import Reply, ToolCall

DEFAULT_SET: Final = "default"
_ID: Final = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_PROBE_FIELDS: Final = frozenset(
    {
        "id",
        "tags",
        "prompt",
        "messages",
        "tools",
        "max_tokens",
        "scripts",
        "answer",
        "tool_call",
        "check",
    }
)
_ROLES: Final = frozenset({"system", "user", "assistant"})
# A reply this much longer than the canonical answer is a runaway, whatever max_tokens says.
_RUNAWAY_FACTOR: Final = 4
_RUNAWAY_SLACK: Final = 80


class GoldenError(layer.ConfigError):
    """A golden set that cannot be used; the message says where and why, on one line."""


def prompt_key(text: str) -> str:
    """The form a prompt is looked up by: NFKC, whitespace runs collapsed to one space."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


@dataclass(frozen=True)
class Golden:
    """One probe: the request to send and how to judge the reply."""

    id: str
    tags: tuple[str, ...]
    messages: tuple[Mapping[str, str], ...]
    tools: tuple[Mapping[str, Any], ...]
    max_tokens: int
    scripts: frozenset[str]
    answer: str | None
    tool_call: ToolCall | None
    checks: tuple[checks.Check, ...]

    @property
    def prompt(self) -> str:
        """The last user message (what a simulator keys its answer by)."""
        return next(m["content"] for m in reversed(self.messages) if m["role"] == "user")

    @property
    def expects_json(self) -> bool:
        return any(isinstance(c, checks.JsonCheck) for c in self.checks)

    @property
    def max_chars(self) -> int:
        """Reply length past which the reply counts as a runaway."""
        reference = self.answer or (self.tool_call.arguments if self.tool_call else "")
        return _RUNAWAY_FACTOR * len(reference) + _RUNAWAY_SLACK

    def request(self, model: str) -> dict[str, Any]:
        """The chat-completions body: greedy, short, streamed with usage."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [dict(m) for m in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "top_p": 1,
            "seed": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.tools:
            body["tools"] = [dict(t) for t in self.tools]
        return body

    def canonical_reply(self) -> Reply:
        """The reply a correct model gives (what the golden set's own test checks)."""
        calls = (self.tool_call,) if self.tool_call else ()
        return Reply(
            status=200,
            content=self.answer or "",
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
        )


@dataclass(frozen=True)
class GoldenSet:
    name: str
    probes: tuple[Golden, ...]

    def by_prompt_key(self) -> dict[str, Golden]:
        """Goldens keyed by :func:`prompt_key` of their last user message."""
        return {prompt_key(g.prompt): g for g in self.probes}

    def __len__(self) -> int:
        return len(self.probes)


def _lines(text: str) -> list[int]:
    """1-based line of each entry of the top-level ``probes`` list (best effort)."""
    try:
        root = layer.compose(text, "<lines>")
    except layer.ConfigError:
        return []
    if not isinstance(root, yaml.MappingNode):
        return []
    for key, value in root.value:
        if key.value == "probes" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []


def _messages(raw: Mapping[str, Any]) -> tuple[Mapping[str, str], ...]:
    if ("prompt" in raw) == ("messages" in raw):
        raise GoldenError("exactly one of `prompt` and `messages` is required")
    if "prompt" in raw:
        if not isinstance(raw["prompt"], str) or not raw["prompt"].strip():
            raise GoldenError("prompt: a non-empty string")
        return ({"role": "user", "content": raw["prompt"]},)
    messages = raw["messages"]
    if not isinstance(messages, list) or not messages:
        raise GoldenError("messages: a non-empty list")
    out = []
    for i, message in enumerate(messages):
        if (
            not isinstance(message, Mapping)
            or set(message) != {"role", "content"}
            or message["role"] not in _ROLES
            or not isinstance(message["content"], str)
        ):
            raise GoldenError(f"messages[{i}]: expected {{role: system|user|assistant, content}}")
        out.append({"role": message["role"], "content": message["content"]})
    if not any(m["role"] == "user" for m in out):
        raise GoldenError("messages: needs a user message")
    return tuple(out)


def _tools(raw: Any) -> tuple[tuple[Mapping[str, Any], ...], dict[str, Mapping[str, Any]]]:
    """The tools as given, and each function's parameters schema by name."""
    if raw is None:
        return (), {}
    if not isinstance(raw, list):
        raise GoldenError("tools: a list of OpenAI tool definitions")
    parameters: dict[str, Mapping[str, Any]] = {}
    for i, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise GoldenError(f"tools[{i}]: expected {{type: function, function: {{name, ...}}}}")
        params = function.get("parameters", {"type": "object"})
        try:
            schema.check_schema(params, f"tools[{i}].function.parameters")
        except schema.SchemaError as exc:
            raise GoldenError(str(exc)) from None
        parameters[function["name"]] = params
    return tuple(raw), parameters


def _tool_call(raw: Any) -> ToolCall | None:
    if raw is None:
        return None
    if (
        not isinstance(raw, Mapping)
        or not isinstance(raw.get("name"), str)
        or not isinstance(raw.get("arguments", {}), Mapping)
    ):
        raise GoldenError("tool_call: expected {name, arguments: {...}}")
    return ToolCall(name=raw["name"], arguments=json.dumps(raw.get("arguments", {})))


def _golden(raw: Any, default_max_tokens: int) -> Golden:
    if not isinstance(raw, Mapping):
        raise GoldenError("each probe is a mapping")
    unknown = set(raw) - _PROBE_FIELDS
    if unknown:
        raise GoldenError(f"unknown fields {sorted(unknown)}")
    if not isinstance(raw.get("id"), str) or not _ID.match(raw["id"]):
        raise GoldenError("id: required, lower-case letters, digits and dashes")
    messages = _messages(raw)
    tools, parameters = _tools(raw.get("tools"))
    answer = raw.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise GoldenError('answer: a string (quote numbers: answer: "42")')
    tool_call = _tool_call(raw.get("tool_call"))
    if (answer is None) == (tool_call is None):
        raise GoldenError("exactly one of `answer` and `tool_call` is required")
    if tool_call is not None and tool_call.name not in parameters:
        raise GoldenError(f"tool_call: {tool_call.name!r} is not among `tools`")
    max_tokens = raw.get("max_tokens", default_max_tokens)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise GoldenError("max_tokens: a positive integer")
    scripts = raw.get("scripts")
    if scripts is not None and not (
        isinstance(scripts, list) and all(isinstance(s, str) for s in scripts)
    ):
        raise GoldenError("scripts: a list of script names (latin, cyrillic, han, ...)")
    expected = checks.Expected(
        answer=answer,
        tool_name=tool_call.name if tool_call else None,
        tool_arguments=json.loads(tool_call.arguments) if tool_call else {},
        tool_parameters=parameters,
    )
    try:
        built = checks.build(raw.get("check"), expected)
    except checks.CheckError as exc:
        raise GoldenError(str(exc)) from None
    last_user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    golden = Golden(
        id=raw["id"],
        tags=tuple(str(t) for t in raw.get("tags") or ()),
        messages=messages,
        tools=tools,
        max_tokens=max_tokens,
        scripts=(
            frozenset(scripts)
            if scripts is not None
            else degeneracy.allowed_scripts(last_user, answer or "")
        ),
        answer=answer,
        tool_call=tool_call,
        checks=built,
    )
    reply = golden.canonical_reply()
    for check in built:
        reason = check.run(reply)
        if reason:
            raise GoldenError(f"check.{check.kind}: the canonical answer fails it ({reason})")
    return golden


def parse(text: str, source: str = "<string>") -> GoldenSet:
    """A golden set from YAML text; ``source`` names the file in error messages."""
    document = layer.parse(text, source, GoldenError)
    if not isinstance(document, Mapping) or not isinstance(document.get("probes"), list):
        raise GoldenError(f"{source}: expected a mapping with `name` and a `probes` list")
    name = document.get("name")
    if not isinstance(name, str) or not _ID.match(name):
        raise GoldenError(f"{source}: name: required, lower-case letters, digits and dashes")
    defaults = document.get("defaults") or {}
    max_tokens = defaults.get("max_tokens", 32) if isinstance(defaults, Mapping) else None
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise GoldenError(f"{source}: defaults.max_tokens: a positive integer")
    lines = _lines(text)
    probes: list[Golden] = []
    for i, raw in enumerate(document["probes"]):
        line = f":{lines[i]}" if i < len(lines) else ""
        label = raw.get("id") if isinstance(raw, Mapping) else None
        try:
            probes.append(_golden(raw, max_tokens))
        except GoldenError as exc:
            raise GoldenError(f"{source}{line}: probes[{i}] ({label}): {exc}") from None
    if not probes:
        raise GoldenError(f"{source}: `probes` is empty")
    _unique(probes, source)
    return GoldenSet(name=name, probes=tuple(probes))


def _unique(probes: Sequence[Golden], source: str) -> None:
    seen_ids: set[str] = set()
    seen_prompts: dict[str, str] = {}
    for golden in probes:
        if golden.id in seen_ids:
            raise GoldenError(f"{source}: duplicate probe id {golden.id!r}")
        seen_ids.add(golden.id)
        key = prompt_key(golden.prompt)
        if key in seen_prompts:
            raise GoldenError(
                f"{source}: probes {seen_prompts[key]!r} and {golden.id!r} share a last user "
                "message; answers are looked up by it, so it must be unique"
            )
        seen_prompts[key] = golden.id


def builtin_names() -> list[str]:
    """Names of the golden sets shipped with inferwatch."""
    folder = resources.files("inferwatch.probes").joinpath("goldens")
    return sorted(
        f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml")
    )


def load(name_or_path: str = DEFAULT_SET) -> GoldenSet:
    """A shipped set by name (``default``) or a set from a YAML file path."""
    if name_or_path in builtin_names():
        resource = resources.files("inferwatch.probes").joinpath("goldens", name_or_path + ".yaml")
        return parse(resource.read_text(encoding="utf-8"), f"goldens/{name_or_path}.yaml")
    path = Path(name_or_path)
    if not path.is_file():
        raise GoldenError(
            f"{name_or_path}: no such golden set (shipped: {', '.join(builtin_names())}) or file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GoldenError(f"{path}: cannot read ({exc})") from None
    return parse(text, str(path))
