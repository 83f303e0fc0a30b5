"""What the simulated model says: golden answers for probe prompts, plausible filler otherwise.

Text is handled as *pieces*, the simulator's tokens: a word or one punctuation mark with the
whitespace before it, so that ``"".join(pieces)`` gives the text back exactly. A prompt's token
count is the number of its pieces plus a few per chat message for the template.

Golden sets are the YAML files of ``probes/goldens/`` (format at the top of ``default.yaml``):
each probe has a ``prompt`` or ``messages`` and an ``answer`` or ``tool_call``. Answers are
looked up by the last user message, NFKC-normalized with whitespace runs collapsed, so a
healthy simulator passes every shipped probe.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from inferwatch import config as layer

_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+$")
EOS = ""  # the end-of-sequence token: counted as generated, adds no text

DEGENERATE_MODES = ("repetition", "empty", "wrong_script", "wrong_answer")

_FILLER_TEXT = (
    "the service keeps a steady latency while the queue stays short and the cache holds "
    "recent prefixes so repeated prompts start faster than new ones each replica reports "
    "its tokens and errors so that the operators can see load and capacity before users "
    "notice a slowdown batching shares every decode step between many requests which "
    "raises throughput at a small cost in time per token"
)
_FILLER_WORDS = tuple(_FILLER_TEXT.split())
_OTHER_SCRIPT_TEXT = "это ответ на ваш вопрос и он написан другим алфавитом"
_OTHER_SCRIPT = tuple(_OTHER_SCRIPT_TEXT.split())


def pieces(text: str) -> list[str]:
    """Split text into pieces whose concatenation is the text."""
    return _PIECE.findall(text)


def prompt_key(text: str) -> str:
    """NFKC, whitespace runs collapsed to one space (the golden lookup key)."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def chat_tokens(messages: Sequence[Mapping[str, str]]) -> list[str]:
    """Token pieces of a chat after a Llama-3-like template (header, content, end)."""
    tokens: list[str] = ["<|begin_of_text|>"]
    for message in messages:
        tokens += ["<|start_header_id|>", message["role"], "<|end_header_id|>"]
        tokens += pieces(message["content"])
        tokens.append("<|eot_id|>")
    return [*tokens, "<|start_header_id|>", "assistant", "<|end_header_id|>"]


def text_tokens(prompt: str) -> list[str]:
    return ["<|begin_of_text|>", *pieces(prompt)]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Answer:
    """The reply planned for one request: content pieces or one tool call."""

    pieces: tuple[str, ...]
    tool_call: ToolCall | None = None
    natural_end: bool = True  # ends with EOS (finish_reason stop) if max_tokens allows


@dataclass(frozen=True)
class GoldenAnswer:
    answer: str | None
    tool_call: ToolCall | None


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def filler(seed: int, count: int) -> list[str]:
    """``count`` pieces of plausible English, the same for the same seed."""
    rng = random.Random(seed)
    out: list[str] = []
    sentence = 0
    while len(out) < count:
        word = rng.choice(_FILLER_WORDS)
        if sentence == 0:
            word = word.capitalize()
        out.append(word if not out else " " + word)
        sentence += 1
        if sentence > 6 and rng.random() < 0.2:
            out.append(".")
            sentence = 0
    return out[:count]


class AnswerBook:
    """Golden answers keyed by prompt, and the rules for everything else."""

    def __init__(self, goldens: Mapping[str, GoldenAnswer], seed: int = 0) -> None:
        self._goldens = dict(goldens)
        self._seed = seed
        self._keys = sorted(self._goldens)

    @classmethod
    def from_dir(cls, folder: Path | None, seed: int = 0) -> AnswerBook:
        """Read every ``*.yaml`` golden set in ``folder`` (None: the shipped sets)."""
        files: Iterable[Any]
        if folder is None:
            files = [
                f
                for f in resources.files("inferwatch.probes").joinpath("goldens").iterdir()
                if f.name.endswith(".yaml")
            ]
        else:
            files = sorted(Path(folder).glob("*.yaml"))
        goldens: dict[str, GoldenAnswer] = {}
        for file in files:
            goldens.update(_read_golden_file(file.read_text(encoding="utf-8"), str(file)))
        return cls(goldens, seed)

    def __len__(self) -> int:
        return len(self._goldens)

    def answer(
        self,
        last_user_message: str,
        *,
        tools_offered: bool,
        max_tokens: int,
        ignore_eos: bool = False,
        degenerate: str | None = None,
    ) -> Answer:
        """The reply to a prompt; ``degenerate`` names a fault mode to apply."""
        key = prompt_key(last_user_message)
        golden = self._goldens.get(key)
        if degenerate == "wrong_answer":
            return Answer(tuple(pieces(self._wrong(key, golden))))
        if degenerate == "empty":
            return Answer(())
        if degenerate == "repetition":
            loop = pieces(" " + (golden.answer if golden and golden.answer else "the same words"))
            repeated = loop * (max_tokens // len(loop) + 1)
            return Answer(tuple(repeated[:max_tokens]), natural_end=False)
        if degenerate == "wrong_script":
            rng = random.Random(_seed(self._seed, key))
            return Answer(tuple(" " + rng.choice(_OTHER_SCRIPT) for _ in range(8)))
        if golden is not None and golden.tool_call is not None and tools_offered:
            return Answer((), tool_call=golden.tool_call)
        if golden is not None and golden.answer is not None:
            planned = pieces(golden.answer)
        else:
            rng = random.Random(_seed(self._seed, key))
            planned = filler(_seed(self._seed, key), rng.randint(24, 160))
        if ignore_eos and len(planned) < max_tokens:
            planned += filler(_seed(self._seed, key, "more"), max_tokens - len(planned))
            return Answer(tuple(planned), natural_end=False)
        return Answer(tuple(planned))

    def _wrong(self, key: str, golden: GoldenAnswer | None) -> str:
        """A plausible wrong reply: a number off by one, else another golden's answer."""
        if golden is not None and golden.answer is not None:
            number = re.fullmatch(r"\s*(-?\d+)(\.\d+)?\s*", golden.answer)
            if number:
                return str(int(number.group(1)) + 1) + (number.group(2) or "")
        others = [k for k in self._keys if k != key and self._goldens[k].answer]
        if others:
            return self._goldens[others[_seed(self._seed, key) % len(others)]].answer or ""
        return "I do not know."


def _read_golden_file(text: str, source: str) -> dict[str, GoldenAnswer]:
    """Prompt key -> answer for one golden YAML file (entries without a prompt are skipped)."""
    data = layer.parse(text, source) or {}
    probes = data.get("probes", []) if isinstance(data, dict) else data
    out: dict[str, GoldenAnswer] = {}
    for probe in probes if isinstance(probes, list) else []:
        if not isinstance(probe, dict):
            continue
        prompt = probe.get("prompt")
        if prompt is None and isinstance(probe.get("messages"), list):
            users = [
                m.get("content")
                for m in probe["messages"]
                if isinstance(m, dict) and m.get("role") == "user"
            ]
            prompt = users[-1] if users else None
        if not isinstance(prompt, str):
            continue
        answer = probe.get("answer")
        call = probe.get("tool_call")
        tool_call = None
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments", {})
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            tool_call = ToolCall(call["name"], arguments)
        out[prompt_key(prompt)] = GoldenAnswer(None if answer is None else str(answer), tool_call)
    return out
