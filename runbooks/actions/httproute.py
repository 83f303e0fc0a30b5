"""Gateway API ``HTTPRoute`` weight shift: move a failing backend's traffic to its fallback.

In every rule of the route whose ``backendRefs`` name both the failing backend (a model
version's Service) and its fallback, the failing backend's weight moves to the fallback in
stages (``steps``: the increasing fractions moved, as the HAProxy action takes them)
``step_interval`` seconds apart, each written with the route's ``resourceVersion`` (re-read
and recomputed on 409) and read back before the next. The weights before the shift and the
alerts that want it are recorded on the route, in the annotation
``weight-shift.inferwatch.io/<backend>``, so a second receiver, a restarted one or a revert
starts from the route alone; the last alert's revert walks the weights back through the same
fractions and removes the record with the last stage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, ClassVar

from kubernetes import client

from inferwatch.runbooks.actions.base import ActionError, Alert, Outcome, Step
from inferwatch.runbooks.actions.kubernetes_api import (
    DEFAULT_TIMEOUT_S,
    MERGE_PATCH,
    KubernetesAction,
    Obj,
    alert_reason,
    annotations_of,
    body,
    call,
    check_params,
    object_name,
    read_modify_write,
)
from inferwatch.runbooks.actions.params import DEFAULT_INTERVAL, DEFAULT_STEPS, fill, shift_steps

GROUP, VERSION, PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"
PREFIX = "weight-shift.inferwatch.io/"
#: Gateway API's default weight of a backendRef without one
_DEFAULT_WEIGHT = 1


def _template(params: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> str:
    """Parameter ``name`` with ``{label}`` replaced by the alert's label values."""
    raw = params.get(name)
    if not isinstance(raw, str):
        raise ActionError(f"parameter {name} is required (a name, may use {{label}})")
    return object_name(fill(raw, labels, url_safe=False), f"parameter {name}")


def _bounded(params: Mapping[str, Any], name: str, default: float, low: float, high: float) -> Any:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ActionError(f"parameter {name} must be a number in [{low}, {high}], got {value!r}")
    return value


def _weight(ref: Mapping[str, Any]) -> int:
    return int(ref.get("weight", _DEFAULT_WEIGHT))


#: the kinds of backend a shift moves weight between: a Service, or the Inference Extension's
#: pool of a model's pods
_BACKENDS = {("", "Service"), ("inference.networking.k8s.io", "InferencePool")}


def _is(ref: Mapping[str, Any], backend: str) -> bool:
    kind = (ref.get("group", ""), ref.get("kind", "Service"))
    return ref.get("name") == backend and kind in _BACKENDS


def _originals(route: Obj, backend: str, fallback: str) -> list[list[int]]:
    """[rule index, backend weight, fallback weight] of each rule that routes to both."""
    found = []
    for index, rule in enumerate((route.get("spec") or {}).get("rules") or []):
        refs = rule.get("backendRefs") or []
        mine = [r for r in refs if _is(r, backend)]
        theirs = [r for r in refs if _is(r, fallback)]
        if mine and not theirs:
            raise ValueError(f"rule {index} routes to {backend} but not to its fallback {fallback}")
        if mine:
            found.append([index, _weight(mine[0]), _weight(theirs[0])])
    if not found:
        raise ValueError(f"no rule routes to {backend}")
    return found


def _record(route: Obj, backend: str) -> dict[str, Any] | None:
    try:
        record = json.loads(annotations_of(route).get(PREFIX + backend, ""))
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("original"), list) else None


def _weights(original: list[list[int]], moved_share: float) -> dict[int, tuple[int, int]]:
    """Per rule index, (backend, fallback) weights with ``moved_share`` of the traffic moved."""
    result = {}
    for index, backend, fallback in original:
        moved = round(backend * moved_share)
        result[index] = (backend - moved, fallback + moved)
    return result


def _refs(route: Obj, index: int, desired: Mapping[str, Any]) -> list[int]:
    """[backend weight, fallback weight] of one recorded rule."""
    try:
        refs = route["spec"]["rules"][index]["backendRefs"]
        return [
            _weight(next(r for r in refs if _is(r, desired["backend"]))),
            _weight(next(r for r in refs if _is(r, desired["fallback"]))),
        ]
    except (KeyError, IndexError, TypeError, StopIteration):
        raise ValueError(
            f"rule {index} no longer routes to {desired['backend']} and {desired['fallback']}"
            " (the route was edited during the shift)"
        ) from None


def _stage(desired: Mapping[str, Any], moved_share: float, last: bool) -> Any:
    """The change to one stage's weights; a no-op when the route is at or past the stage.

    Reverting, the ``last`` stage restores the recorded weights and removes the record.
    """
    backend, fallback, reverting = desired["backend"], desired["fallback"], desired["reverting"]
    fingerprint = desired["fingerprint"]
    key = PREFIX + backend

    def change(route: Obj) -> Obj | None:
        record = _record(route, backend)
        if record is None:
            if reverting:
                return None
            record = {"fallback": fallback, "original": _originals(route, backend, fallback)}
        alerts = [str(a) for a in record.get("alerts") or []]
        if not reverting and fingerprint not in alerts:
            record = {**record, "alerts": [*alerts, fingerprint]}
        value: str | None = json.dumps(record, sort_keys=True)
        target = _weights(record["original"], moved_share)
        if reverting and last:
            value = None
        elif all(
            (_refs(route, i, desired)[0] >= w) if reverting else (_refs(route, i, desired)[0] <= w)
            for i, (w, _) in target.items()
        ):
            if annotations_of(route).get(key) == value:
                return None
            return {"metadata": {"annotations": {key: value}}}  # past the stage: record only
        rules = json.loads(json.dumps(route["spec"]["rules"]))
        for index, (mine, theirs) in target.items():
            for ref in rules[index]["backendRefs"]:
                if _is(ref, backend):
                    ref["weight"] = mine
                elif _is(ref, fallback):
                    ref["weight"] = theirs
        return {"metadata": {"annotations": {key: value}}, "spec": {"rules": rules}}

    return change


def _release(desired: Mapping[str, Any]) -> Any:
    """Drop this alert from the record while other alerts still want the shift."""
    key, fingerprint = PREFIX + desired["backend"], desired["fingerprint"]

    def change(route: Obj) -> Obj | None:
        record = _record(route, desired["backend"])
        alerts = [str(a) for a in (record or {}).get("alerts") or []]
        if record is None or fingerprint not in alerts or alerts == [fingerprint]:
            return None
        kept = {**record, "alerts": [a for a in alerts if a != fingerprint]}
        return {"metadata": {"annotations": {key: json.dumps(kept, sort_keys=True)}}}

    return change


def _observed(route: Obj, desired: Mapping[str, Any]) -> dict[str, Any]:
    record = _record(route, desired["backend"])
    indexes = [entry[0] for entry in record["original"]] if record else []
    return {
        "weights": {str(i): _refs(route, i, desired) for i in indexes},
        "shifted": record is not None,
        "resourceVersion": route["metadata"]["resourceVersion"],
    }


class HTTPRouteShift(KubernetesAction):
    """Shift an HTTPRoute's weight from ``backend`` to ``fallback`` (see the module docstring).

    Parameters: ``route``, ``backend``, ``fallback`` (names; ``{label}`` is replaced by the
    alert's label, e.g. ``llama-{model_version}``), ``namespace`` (default: the alert's
    ``namespace`` label), ``steps`` (increasing fractions ending at 1, default 0.25, 0.5, 1),
    ``step_interval`` (seconds, default 5).
    """

    name: ClassVar[str] = "kubernetes_httproute_shift"
    PARAMS: ClassVar[frozenset[str]] = frozenset(
        {"namespace", "route", "backend", "fallback", "steps", "step_interval"}
    )

    @cached_property
    def _custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self._api)

    def plan(self, alert: Alert, params: Mapping[str, Any]) -> Sequence[Step]:
        check_params(params, self.PARAMS, self.name)
        labels = alert.labels
        namespace = object_name(
            params.get("namespace", labels.get("namespace")), "namespace (parameter or label)"
        )
        route = _template(params, "route", labels)
        backend = _template(params, "backend", labels)
        fallback = _template(params, "fallback", labels)
        if backend == fallback:
            raise ActionError(f"backend and fallback are both {backend}")
        desired = {
            "namespace": namespace,
            "route": route,
            "backend": backend,
            "fallback": fallback,
            "steps": list(shift_steps(params.get("steps", DEFAULT_STEPS))),
            "step_interval": float(_bounded(params, "step_interval", DEFAULT_INTERVAL, 0, 600)),
            "fingerprint": alert.fingerprint,
        }
        target = f"httproute {namespace}/{route} {backend}->{fallback}"
        group = f"httproute {namespace}/{route}"
        return [Step(self.name, target, "traffic", group, desired, alert_reason(alert))]

    def _read(self, desired: Mapping[str, Any]) -> Obj:
        response = self._custom.get_namespaced_custom_object(
            GROUP,
            VERSION,
            desired["namespace"],
            PLURAL,
            desired["route"],
            _preload_content=False,
            _request_timeout=DEFAULT_TIMEOUT_S,
        )
        return body(response)

    def _write(self, desired: Mapping[str, Any], patch: Obj) -> Obj:
        response = self._custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            desired["namespace"],
            PLURAL,
            desired["route"],
            patch,
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=DEFAULT_TIMEOUT_S,
        )
        return body(response)

    def _rmw(self, desired: Mapping[str, Any], change: Any) -> tuple[Obj | None, Obj]:
        return read_modify_write(
            lambda: self._read(desired), change, lambda p: self._write(desired, p), self._retries
        )

    async def _walk(self, step: Step, reverting: bool) -> Outcome:
        desired = {**step.desired, "reverting": reverting}
        if reverting:

            def release() -> Outcome:
                patch, route = self._rmw(desired, _release(desired))
                record = _record(route, desired["backend"])
                ours = record is not None and desired["fingerprint"] in record.get("alerts", [])
                return Outcome(True, patch is not None, "", {"walk_back": ours})

            released = await call(step.target, release)
            if not released.ok or released.changed or not released.observed["walk_back"]:
                detail = (
                    "kept shifted for other alerts"
                    if released.changed
                    else "not shifted for this alert"
                )
                detail = released.detail if not released.ok else f"{step.target}: {detail}"
                return Outcome(released.ok, released.changed, detail)
        fractions: list[float] = desired["steps"]
        # reverting walks back through the same fractions to none moved
        shares = [*reversed(fractions[:-1]), 0.0] if reverting else fractions
        changed = False
        observed: Mapping[str, Any] = {}
        for stage, share in enumerate(shares, start=1):
            change = _stage(desired, share, last=stage == len(shares))

            def work(change: Any = change) -> Outcome:
                patch, _ = self._rmw(desired, change)
                return self._read_back(desired, patch)

            outcome = await call(step.target, work)
            if not outcome.ok:
                return outcome
            changed = changed or outcome.changed
            observed = outcome.observed
            if outcome.changed and stage < len(shares):
                await asyncio.sleep(desired["step_interval"])
        done = "reverted" if reverting else "shifted"
        return Outcome(
            True, changed, f"{step.target}: {done if changed else 'already ' + done}", observed
        )

    def _read_back(self, desired: Mapping[str, Any], patch: Obj | None) -> Outcome:
        """Read the route again: the rules and record a stage wrote must be there."""
        route = self._read(desired)
        observed = _observed(route, desired)
        if patch is None:
            return Outcome(True, False, "at or past this stage", observed)
        key = PREFIX + desired["backend"]
        if ("spec" in patch and route["spec"]["rules"] != patch["spec"]["rules"]) or annotations_of(
            route
        ).get(key) != patch["metadata"]["annotations"][key]:
            return Outcome(
                False, True, f"read back {observed['weights']}: not what was written", observed
            )
        return Outcome(True, True, "weights read back", observed)

    async def apply(self, step: Step) -> Outcome:
        return await self._walk(step, reverting=False)

    async def revert(self, step: Step) -> Outcome:
        return await self._walk(step, reverting=True)

    async def verify(self, step: Step) -> Outcome:
        desired = step.desired

        def work() -> Outcome:
            route = self._read(desired)
            record = _record(route, desired["backend"])
            observed = _observed(route, desired)
            if record is None:
                return Outcome(False, False, f"{step.target}: no shift recorded", observed)
            for index, mine, theirs in record["original"]:
                if _refs(route, index, desired) != [0, mine + theirs]:
                    return Outcome(
                        False, False, f"{step.target}: rule {index} not shifted", observed
                    )
            return Outcome(True, False, f"{step.target}: shifted", observed)

        return await call(step.target, work)
