"""Refusals that say a probe does not apply to a replica, not that its quality is bad.

Some requests an engine refuses because of how it was started: vLLM without
``--enable-auto-tool-choice`` (llama.cpp without ``--jinja``) refuses ``tools``, and every engine
refuses a prompt or ``max_tokens`` over its context. Such a probe says nothing of the model's
answers, so it is reported as not applicable and left out of the verdict; it also never reaches
the engine's request counters. Any other refusal is a failure like any other.
"""

from __future__ import annotations

from typing import Final

from inferwatch.probes.golden import Golden
from inferwatch.probes.reply import Reply

TOOLS_OFF: Final = "tool_calling_off"
CONTEXT_TOO_SHORT: Final = "context_too_short"
#: words of the engines' 400 messages (vLLM, SGLang, llama.cpp) for each configuration refusal
_TOOL_WORDS: Final = ("enable-auto-tool-choice", "tool-call-parser", "--jinja")
_CONTEXT_WORDS: Final = (
    "maximum context length",
    "maximum model length",
    "max_model_len",
    "context size",
    "context length",
)


def not_applicable(golden: Golden, reply: Reply) -> str | None:
    """Why the engine's refusal of ``golden`` is its configuration's, or None."""
    if reply.status != 400:
        return None
    message = reply.detail.lower()
    if golden.tools and any(word in message for word in _TOOL_WORDS):
        return TOOLS_OFF
    if any(word in message for word in _CONTEXT_WORDS):
        return CONTEXT_TOO_SHORT
    return None
