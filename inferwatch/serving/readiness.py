"""Readiness as data: the conditions every server's ``/readyz`` is built from.

A replica's sidecar, the probe server, the proxy and the receiver each answer ``/readyz`` from
a list of ``Condition``s, so that one failing reason is named the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Condition", "SourceFailure"]


@dataclass(frozen=True)
class Condition:
    """One reason a replica should, or should not, take traffic."""

    name: str
    ok: bool
    reason: str = ""


class SourceFailure(Exception):
    """A failure its source has already recorded and logged (an engine's failed scrape), so
    that whoever catches it does not log it twice."""
