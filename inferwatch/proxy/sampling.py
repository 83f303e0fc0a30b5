"""Text of the few responses sampled for degeneracy screening, collected as they pass.

A sampled request gets a :class:`TranscribingMeter` instead of a plain usage meter: it reads
the same parsed body or stream events the meter reads anyway, so collecting the text costs no
extra parsing, and unsampled requests run the plain meter untouched. Only the first choice is
kept, and only as much of it as the detectors examine (:data:`degeneracy.MAX_CHARS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.probes import degeneracy
from inferwatch.proxy.usage import UsageMeter, content_text


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text a reply should answer: the last user message, or a completion's prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, Mapping) and message.get("role") == "user":
                return content_text(message.get("content"))[: degeneracy.MAX_CHARS]
        return ""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]  # choice 0 answers the first prompt of a batch
    return prompt[: degeneracy.MAX_CHARS] if isinstance(prompt, str) else ""


class TranscribingMeter(UsageMeter):
    """A usage meter that also keeps the first choice's text, for one sampled request."""

    def __init__(self, prompt_estimate: int, prompt: str) -> None:
        super().__init__(prompt_estimate)
        self._prompt = prompt
        self._pieces: list[str] = []
        self._room = degeneracy.MAX_CHARS
        self._tool_call = False

    def _observe_choice(self, choice: Mapping[str, Any]) -> None:
        super()._observe_choice(choice)
        if choice.get("index", 0) != 0:
            return
        text = choice.get("text")  # /v1/completions
        message = choice.get("delta") or choice.get("message")
        if isinstance(message, Mapping):
            text = message.get("content")
            if message.get("tool_calls") or message.get("function_call"):
                self._tool_call = True
        if isinstance(text, str) and text and self._room > 0:
            self._pieces.append(text[: self._room])
            self._room -= len(self._pieces[-1])

    def take(self) -> tuple[str, str, bool]:
        """Prompt, completion and whether a tool call came back; the text is dropped here."""
        taken = (self._prompt, "".join(self._pieces), self._tool_call)
        self._prompt, self._pieces = "", []
        return taken
