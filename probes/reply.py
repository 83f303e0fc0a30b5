"""What an engine answered to one probe request, as the checks see it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A function call from the model; ``arguments`` is the raw JSON text it produced."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Reply:
    """One chat completion, or the transport error that prevented it.

    ``error`` is a short reason (``connect``, ``timeout``, ``http_503``, ``bad_response``)
    when no usable completion came back; the timings are in seconds from the request start.
    """

    status: int = 0
    error: str = ""
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    total_s: float = 0.0
    model: str = ""
    system_fingerprint: str = ""
    #: the engine's error message when it refused the request (bounded)
    detail: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.error

    def as_json(self) -> dict[str, Any]:
        """A compact description for logs and ``--json`` output."""
        return {
            "status": self.status,
            "error": self.error,
            "content": self.content,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in self.tool_calls],
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
        }
