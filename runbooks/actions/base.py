"""What every runbook action implements, so that the receiver drives them all one way.

An action is declarative: :meth:`Action.plan` turns an alert into the desired state of each
target (pure, no I/O), :meth:`Action.apply` makes the target match it and reports a no-op
when it already does, so that a redelivered alert or a second receiver changes nothing.
The state itself lives in the target system (a sidecar's isolation flag, a node's taint, a
gateway's weights), never in the receiver, so a restarted receiver reads it back from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

#: what a step takes out of service, for the circuit breaker's per-group fractions
Unit = Literal["replica", "gpu", "node", "traffic"]


class ActionError(Exception):
    """Bad parameters or an alert the action cannot act on (missing label); nothing changed."""


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert of an Alertmanager webhook (version 4) payload."""

    status: Literal["firing", "resolved"]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: str
    ends_at: str
    fingerprint: str
    generator_url: str = ""


@dataclass(frozen=True, slots=True)
class Step:
    """One target and the state an action wants it in.

    ``target`` names the thing changed (``sidecar http://10.0.0.5:9400``, ``node gpu-3``,
    ``haproxy llama/v2``); ``unit`` and ``group`` tell the breaker what is taken out of
    service and out of which population (a model's replicas, a node pool's GPUs or nodes).
    """

    action: str
    target: str
    unit: Unit
    group: str
    desired: Mapping[str, Any]
    reason: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """What applying, verifying or reverting a step found. ``changed`` is False for a no-op."""

    ok: bool
    changed: bool
    detail: str
    observed: Mapping[str, Any] = field(default_factory=dict)


class Action(Protocol):
    """A runbook action (see the module docstring)."""

    name: ClassVar[str]

    def plan(self, alert: Alert, params: Mapping[str, Any]) -> Sequence[Step]:
        """The steps for one firing alert; raises :class:`ActionError`, never does I/O."""
        ...

    async def apply(self, step: Step) -> Outcome:
        """Bring the target to ``step.desired``; a no-op (``changed=False``) when it is."""
        ...

    async def verify(self, step: Step) -> Outcome:
        """Read the target back: ``ok`` when it is in ``step.desired``."""
        ...

    async def revert(self, step: Step) -> Outcome:
        """Undo the step (rollback when the alert resolves); a no-op when already undone."""
        ...
