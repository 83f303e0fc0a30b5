"""Judge one reply against its golden, cheapest check first.

Stages run in order: transport (status, TTFT, total time) -> degeneracy (empty, repetition,
wrong script, runaway, ``finish_reason=length``, invalid JSON) -> structure (JSON schema,
tool-call shape) -> answer (exact, contains, regex, numeric) -> similarity. The first stage
that fails ends the judgement: a degenerate reply is reported as degenerate, not also as a
wrong answer, so per-check failure counts point at the cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from inferwatch.probes import degeneracy
from inferwatch.probes.golden import Golden
from inferwatch.probes.reply import Reply

STAGES: Final = ("transport", "degeneracy", "structure", "answer", "similarity")


@dataclass(frozen=True)
class Limits:
    """Transport limits; a reply slower than these fails even when its answer is right."""

    ttft_s: float = 10.0
    total_s: float = 30.0


@dataclass(frozen=True)
class Outcome:
    """The verdict on one reply: ``failures`` maps each failed check to its reason."""

    golden: Golden
    reply: Reply
    failures: dict[str, str] = field(default_factory=dict)
    stage: str = ""  # the stage that failed, "" when the reply passed

    @property
    def passed(self) -> bool:
        return not self.failures


def _transport(reply: Reply, limits: Limits) -> dict[str, str]:
    if reply.error:
        return {"transport": reply.error}
    if reply.ttft_s is not None and reply.ttft_s > limits.ttft_s:
        return {"ttft": f"{reply.ttft_s:.2f}s > {limits.ttft_s:g}s"}
    if reply.total_s > limits.total_s:
        return {"duration": f"{reply.total_s:.2f}s > {limits.total_s:g}s"}
    return {}


def _degeneracy(reply: Reply, golden: Golden) -> dict[str, str]:
    fired = degeneracy.detect(
        reply.content,
        allowed=golden.scripts,
        finish_reason=reply.finish_reason,
        max_chars=golden.max_chars,
        expect_json=golden.expects_json,
        has_tool_call=bool(reply.tool_calls),
    )
    return {signal: "detected" for signal in sorted(fired)}


def score(golden: Golden, reply: Reply, limits: Limits | None = None) -> Outcome:
    limits = limits or Limits()
    failures = _transport(reply, limits)
    if failures:
        return Outcome(golden, reply, failures, "transport")
    failures = _degeneracy(reply, golden)
    if failures:
        return Outcome(golden, reply, failures, "degeneracy")
    for stage in STAGES[2:]:
        failures = {}
        for check in golden.checks:
            if check.stage == stage:
                reason = check.run(reply)
                if reason:
                    failures[check.kind] = reason
        if failures:
            return Outcome(golden, reply, failures, stage)
    return Outcome(golden, reply)
