"""Shift traffic off a failing model version, or a whole model, in HAProxy (Runtime API).

The gateway config (``inferwatch generate gateway``) gives each model one backend holding its
replicas, named ``<version>:<replica>``, and its fallback model's replicas at weight 0, named
``fallback:<replica>``. Draining a version lowers its servers' weights to 0 in steps, so the
other versions take its share; when no other server of the model is left carrying traffic,
the fallback servers are raised by the same steps instead. Revert walks back in the same
steps to the weights the config gave (HAProxy's ``initial`` weight) and the fallback to 0.

The weights live in HAProxy, so apply and revert start from what HAProxy reports: a repeat
is a no-op, and a shift that a stopped receiver left halfway is finished from where it stands.

Settings (``actions.shift_traffic``): ``runtime``, the Runtime API address (unix socket path
or ``host:port``) and ``timeout`` per command. Parameters per mapping: ``scope``
(``version``, the default when the alert has a ``model_version`` label, or ``model``),
``steps`` (increasing fractions ending at 1, default 0.25, 0.5, 1), ``step_interval``
(seconds between steps, default 5) and ``backend`` (default: the model's generated backend).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from inferwatch.runbooks.actions.base import ActionError, Alert, Outcome, Step
from inferwatch.runbooks.actions.params import DEFAULT_INTERVAL, DEFAULT_STEPS, shift_steps
from inferwatch.runbooks.haproxy_runtime import (
    TIMEOUT_S,
    RuntimeApi,
    RuntimeApiError,
    ServerState,
    valid_name,
)
from inferwatch.wire import FALLBACK, backend_name, parse_server_name

MAX_WEIGHT = 256
Weights = dict[str, int]


class ShiftTraffic:
    name: ClassVar[str] = "shift_traffic"

    def __init__(self, runtime: str, timeout: float = TIMEOUT_S) -> None:
        self.api = RuntimeApi(runtime, timeout)

    def plan(self, alert: Alert, params: Mapping[str, Any]) -> Sequence[Step]:
        unknown = set(params) - {"scope", "steps", "step_interval", "backend"}
        if unknown:
            raise ActionError(f"unknown parameters {sorted(unknown)}")
        model = alert.labels.get("model")
        if not model:
            raise ActionError("the alert has no 'model' label")
        version = alert.labels.get("model_version") or None
        scope = params.get("scope", "version" if version else "model")
        if scope not in ("version", "model"):
            raise ActionError(f"scope must be 'version' or 'model', not {scope!r}")
        if scope == "version" and version is None:
            raise ActionError("scope 'version' needs a 'model_version' label on the alert")
        backend = str(params.get("backend") or backend_name(model))
        if not valid_name(backend):
            raise ActionError(f"backend {backend[:80]!r}: HAProxy names are A-Z a-z 0-9 . _ : -")
        steps = shift_steps(params.get("steps", DEFAULT_STEPS))
        interval = params.get("step_interval", DEFAULT_INTERVAL)
        if not isinstance(interval, int | float) or isinstance(interval, bool) or interval < 0:
            raise ActionError(f"step_interval must be seconds >= 0, not {interval!r}")
        drained = version if scope == "version" else None
        summary = alert.annotations.get("summary", "")
        reason = f"{alert.labels.get('alertname', '')}: {summary}".strip(": ")[:256]
        target = f"haproxy {backend}" + (f" version {drained}" if drained else "")
        return [
            Step(
                action=self.name,
                target=target,
                unit="traffic",
                group=model,
                desired={
                    "backend": backend,
                    "drain": drained,  # None: the whole model
                    "steps": list(steps),
                    "step_interval": float(interval),
                },
                reason=reason,
            )
        ]

    async def apply(self, step: Step) -> Outcome:
        return await self._walk(step, shifted=True)

    async def revert(self, step: Step) -> Outcome:
        return await self._walk(step, shifted=False)

    async def verify(self, step: Step) -> Outcome:
        try:
            states = await self.api.servers(step.desired["backend"])
            want = _target(states, step.desired["drain"], shifted=True)
            weights = await self._read(step.desired["backend"], want)
        except (RuntimeApiError, ActionError) as exc:
            return Outcome(False, False, str(exc))
        if weights == want:
            return Outcome(True, False, f"weights read back: {_show(weights)}", weights)
        return Outcome(False, False, f"weights {_show(weights)}, wanted {_show(want)}", weights)

    async def _walk(self, step: Step, *, shifted: bool) -> Outcome:
        """Move the weights to the shifted (or original) state in the step's fractions."""
        backend = step.desired["backend"]
        changed = False
        try:
            states = await self.api.servers(backend)
            start = {s.name: s.weight for s in states}
            end = _target(states, step.desired["drain"], shifted=shifted)
            if all(start[name] == weight for name, weight in end.items()):
                return Outcome(True, False, f"already at {_show(end)}", end)
            schedule = _schedule(start, end, step.desired["steps"])
            current = dict(start)
            for index, weights in enumerate(schedule):
                # raise before lowering, so that the model never has no server at all
                moves = [(name, w) for name, w in weights.items() if w != current[name]]
                for name, weight in sorted(moves, key=lambda move: move[1] < current[move[0]]):
                    await self.api.set_weight(backend, name, weight)
                    changed = True
                current.update(weights)
                if index < len(schedule) - 1:
                    await asyncio.sleep(step.desired["step_interval"])
            observed = await self._read(backend, end)
        except (RuntimeApiError, ActionError) as exc:
            return Outcome(False, changed, str(exc))
        if observed != end:
            return Outcome(False, changed, f"set {_show(end)}, read {_show(observed)}", observed)
        return Outcome(True, changed, f"weights now {_show(observed)}", observed)

    async def _read(self, backend: str, servers: Mapping[str, int]) -> Weights:
        """Each server's current weight as HAProxy reports it (``get weight``)."""
        return {name: (await self.api.weight(backend, name))[0] for name in servers}


def _target(states: Sequence[ServerState], drain: str | None, *, shifted: bool) -> Weights:
    """The weights of the servers this step owns, shifted or as the config had them.

    A step owns the drained servers, and the fallback servers when nothing else of the model
    would carry traffic once they are drained. Servers it does not own are left alone, so that
    a second shift (another version) composes with the first.
    """
    own = [s for s in states if parse_server_name(s.name)[0] != FALLBACK]
    fallback = [s for s in states if parse_server_name(s.name)[0] == FALLBACK]
    drained = [s for s in own if drain is None or parse_server_name(s.name)[0] == drain]
    if not drained:
        raise ActionError(f"backend {states[0].backend} has no servers of version {drain!r}")
    if not shifted:
        return {s.name: s.initial_weight for s in drained} | {s.name: 0 for s in fallback}
    target = {s.name: 0 for s in drained}
    others = [s for s in own if s not in drained and s.weight > 0]
    if not others and fallback:
        share = sum(s.initial_weight for s in drained) / len(fallback)
        weight = max(1, min(MAX_WEIGHT, round(share)))
        target |= {s.name: weight for s in fallback}
    return target


def _schedule(start: Weights, end: Weights, fractions: Sequence[float]) -> list[Weights]:
    """The weights after each step: ``end``'s servers moved from ``start`` by each fraction."""
    return [
        {name: round(start[name] + (goal - start[name]) * part) for name, goal in end.items()}
        for part in fractions
    ]


def _show(weights: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={weight}" for name, weight in sorted(weights.items()))
