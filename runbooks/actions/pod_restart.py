"""Replica restart: delete the alert's pod so its controller starts a fresh one.

For XIDs whose catalogue action is "restart the application" the GPU is fine and a new
engine process is the fix. The state that makes this declarative is the pod itself: a pod
created at or after the alert started, a pod already terminating, or no pod of that name
means the restart has happened, so redelivery never deletes the replacement. The delete
carries the UID read as a precondition, so it can only remove the pod that was looked at.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, ClassVar

from kubernetes import client

from inferwatch.runbooks.actions.base import ActionError, Alert, Outcome, Step
from inferwatch.runbooks.actions.kubernetes_api import (
    DEFAULT_TIMEOUT_S,
    ConflictsExhausted,
    KubernetesAction,
    Obj,
    alert_reason,
    body,
    call,
    check_params,
    object_name,
)

_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _seconds(stamp: str) -> datetime.datetime:
    """An RFC 3339 time to the second (Alertmanager writes nanoseconds, the API seconds)."""
    match = _RFC3339.match(stamp)
    if not match:
        raise ActionError(f"not an RFC 3339 time: {stamp!r}")
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    return datetime.datetime.fromisoformat(match.group(1) + zone)


def _restarted(pod: Obj, not_before: str) -> str | None:
    """Why ``pod`` needs no restart for a fault at ``not_before``, or None if it does."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return "already terminating"
    created = meta.get("creationTimestamp")
    if created and _seconds(created) >= _seconds(not_before):
        return "started after the fault"
    return None


class PodRestart(KubernetesAction):
    """Delete the pod named by the alert's ``namespace`` and ``pod`` labels."""

    name: ClassVar[str] = "kubernetes_restart_pod"
    PARAMS: ClassVar[frozenset[str]] = frozenset()

    @cached_property
    def _core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self._api)

    def plan(self, alert: Alert, params: Mapping[str, Any]) -> Sequence[Step]:
        check_params(params, self.PARAMS, self.name)
        namespace = object_name(alert.labels.get("namespace"), "alert label namespace")
        pod = object_name(alert.labels.get("pod"), "alert label pod")
        _seconds(alert.starts_at)
        model = alert.labels.get("model")
        group = model or "replicas"  # the receiver counts the inventory entry's population
        desired = {
            "namespace": namespace,
            "pod": pod,
            "not_before": alert.starts_at,
            "fingerprint": alert.fingerprint,
        }
        reason = alert_reason(alert)
        return [Step(self.name, f"pod {namespace}/{pod}", "replica", group, desired, reason)]

    def _read(self, step: Step) -> Obj | None:
        try:
            response = self._core.read_namespaced_pod(
                step.desired["pod"],
                step.desired["namespace"],
                _preload_content=False,
                _request_timeout=DEFAULT_TIMEOUT_S,
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return body(response)

    async def apply(self, step: Step) -> Outcome:
        def work() -> Outcome:
            for _ in range(self._retries + 1):
                pod = self._read(step)
                if pod is None:
                    return Outcome(True, False, f"{step.target}: gone (already restarted)")
                why = _restarted(pod, step.desired["not_before"])
                if why is not None:
                    return Outcome(True, False, f"{step.target}: {why}")
                uid = pod["metadata"]["uid"]
                options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
                try:
                    self._core.delete_namespaced_pod(
                        step.desired["pod"],
                        step.desired["namespace"],
                        body=options,
                        _preload_content=False,
                        _request_timeout=DEFAULT_TIMEOUT_S,
                    )
                except client.ApiException as exc:
                    if exc.status == 409:
                        continue  # replaced since the read: look at the new one
                    if exc.status == 404:
                        return Outcome(True, False, f"{step.target}: gone (already restarted)")
                    raise
                return Outcome(True, True, f"{step.target}: deleted for restart")
            raise ConflictsExhausted(self._retries + 1)

        return await call(step.target, work)

    async def verify(self, step: Step) -> Outcome:
        def work() -> Outcome:
            pod = self._read(step)
            if pod is None:
                return Outcome(True, False, f"{step.target}: gone (restarted)")
            why = _restarted(pod, step.desired["not_before"])
            if why is None:
                return Outcome(False, False, f"{step.target}: still the pod from before the fault")
            return Outcome(True, False, f"{step.target}: {why}")

        return await call(step.target, work)

    async def revert(self, step: Step) -> Outcome:
        return Outcome(True, False, f"{step.target}: a restart is not undone")
