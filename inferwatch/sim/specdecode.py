"""Speculative decoding as vLLM counts it: one draft of ``k`` tokens per decoding request per step.

The target model checks a draft left to right and keeps the longest accepted prefix, so the
tokens accepted at position ``i`` can never outnumber those accepted at ``i - 1``. Each
position is accepted with a conditional probability that falls with its depth (a draft drifts
further from the target the further it runs), with the draft's quality (``acceptance``, the
first position's chance on an idle engine) and with the batch's fill: a full batch carries
more varied traffic, which a small draft predicts less well. Each draft draws ``k`` uniform
numbers, accepted or not, so for the same random stream a worse draft or a fuller batch never
accepts more.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: each deeper position keeps this share of the previous one's acceptance probability
DEPTH_DECAY = 0.85
#: a full batch (fill 1.0) loses this share of every position's acceptance probability
LOAD_PENALTY = 0.3


@dataclass(frozen=True)
class Speculation:
    """One step's drafts: how many, and the accepted count at each draft position."""

    drafts: int
    draft_tokens: int
    accepted_per_position: tuple[int, ...]

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_position)


class Drafter:
    """The draft proposals of one engine rank (``k`` speculative tokens per draft)."""

    def __init__(self, k: int, acceptance: float, rng: random.Random) -> None:
        if k < 1 or not 0.0 <= acceptance <= 1.0:
            raise ValueError("k must be at least 1 and acceptance within [0, 1]")
        self.k = k
        self.acceptance = acceptance
        self._rng = rng

    def probability(self, position: int, fill: float) -> float:
        """The chance that ``position`` is accepted given every earlier one was."""
        load = 1.0 - LOAD_PENALTY * min(max(fill, 0.0), 1.0)
        return self.acceptance * DEPTH_DECAY**position * load

    def step(self, drafts: int, fill: float) -> Speculation:
        """Check ``drafts`` drafts (one per decoding request) at batch fill ``fill`` (0..1)."""
        accepted = [0] * self.k
        chances = [self.probability(position, fill) for position in range(self.k)]
        for _ in range(drafts):
            draws = [self._rng.random() for _ in chances]  # k draws each, accepted or not
            for position, (draw, chance) in enumerate(zip(draws, chances, strict=True)):
                if draw >= chance:
                    break
                accepted[position] += 1
        return Speculation(drafts, drafts * self.k, tuple(accepted))
