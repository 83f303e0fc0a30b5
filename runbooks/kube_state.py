"""The receiver's state in Kubernetes: a ConfigMap as the store, a Lease to elect who acts.

:class:`ConfigMapStore` keeps the state (see :mod:`inferwatch.runbooks.state`) under one key
of a ConfigMap. A transaction reads it, changes it and replaces it with the
``resourceVersion`` it read; when another replica wrote in between, the API server answers
``409 Conflict`` and the transaction runs again on a fresh read, a bounded number of times, so
no replica's change is lost or applied to a stale state. :class:`LeaseElector` holds a
``coordination.k8s.io`` Lease the way client-go's leader election does (renew before
``leaseDurationSeconds`` passes; take over only a lease this replica has seen unchanged for a
whole duration, timed on its own monotonic clock, since the holder's ``renewTime`` is another
machine's clock; every write carries the ``resourceVersion`` read), and only the holder acts:
the others answer 503 and fail ``/readyz``, so their Service sends Alertmanager to the leader.
Both use :data:`~inferwatch.runbooks.kube_facts.STATE_RULES` (the receiver's Role).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from kubernetes import client
from urllib3.exceptions import HTTPError

from inferwatch.logs import log_event
from inferwatch.runbooks.actions.kubernetes_api import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, body
from inferwatch.runbooks.state import MAX_STATE_BYTES, State, StateError, report_skipped

logger = logging.getLogger("inferwatch.runbooks")

T = TypeVar("T")
#: the ConfigMap key holding the state
KEY = "state.json"
LEASE_SECONDS = 15
#: the ``leaseDurationSeconds`` a record may claim; outside, this receiver's own duration holds
LEASE_SECONDS_BOUNDS = (1, 300)


def _api_error(exc: Exception, what: str) -> StateError:
    if isinstance(exc, client.ApiException):
        return StateError(f"{what}: HTTP {exc.status} {exc.reason}")
    return StateError(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")


class ConfigMapStore:
    def __init__(
        self, api: client.ApiClient, namespace: str, name: str, retries: int = DEFAULT_RETRIES
    ) -> None:
        self._core = client.CoreV1Api(api)
        self.namespace, self.name, self.retries = namespace, name, retries
        self.where = f"configmap {namespace}/{name}"
        self.skipped_episodes = 0

    async def transact(self, change: Callable[[State], T]) -> T:
        return await asyncio.to_thread(self._transact, change)

    def _transact(self, change: Callable[[State], T]) -> T:
        for _ in range(self.retries + 1):
            current = self._read()
            data = self._stored(current)
            state = State.from_bytes(data, self.where)
            result = change(state)
            after = state.to_bytes()
            if after != data:
                try:
                    self._write(current, after.decode())
                except client.ApiException as exc:
                    if exc.status != 409:  # 409: another replica wrote first; again, fresh
                        raise _api_error(exc, self.where) from None
                    continue
                except (HTTPError, ValueError) as exc:
                    raise _api_error(exc, self.where) from None
            self.skipped_episodes += report_skipped(state, self.where)
            return result
        raise StateError(f"{self.where}: gave up after {self.retries + 1} conflicting writes")

    def _stored(self, current: dict[str, Any] | None) -> bytes:
        """The state's text in the ConfigMap read; anything but an object of strings there is
        a corrupt state, said in one line."""
        data = (current or {}).get("data") or {}
        text = data.get(KEY, "") if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise StateError(
                f"{self.where}: corrupt receiver state (data.{KEY} is not a string); "
                "move it aside to start from an empty state"
            )
        return text.encode()

    def _read(self) -> dict[str, Any] | None:
        try:
            response: Any = self._core.read_namespaced_config_map(
                self.name,
                self.namespace,
                _preload_content=False,
                _request_timeout=DEFAULT_TIMEOUT_S,
            )
            return body(response, 2 * MAX_STATE_BYTES)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise _api_error(exc, self.where) from None
        except (HTTPError, ValueError) as exc:
            raise _api_error(exc, self.where) from None

    def _write(self, current: dict[str, Any] | None, text: str) -> None:
        if current is None:
            created = {"metadata": {"name": self.name}, "data": {KEY: text}}
            self._core.create_namespaced_config_map(
                self.namespace,
                cast(Any, created),
                _preload_content=False,
                _request_timeout=DEFAULT_TIMEOUT_S,
            )
            return
        meta = current["metadata"]
        replaced = {
            "metadata": {"name": self.name, "resourceVersion": meta["resourceVersion"]},
            "data": {**(current.get("data") or {}), KEY: text},
        }
        self._core.replace_namespaced_config_map(
            self.name,
            self.namespace,
            cast(Any, replaced),
            _preload_content=False,
            _request_timeout=DEFAULT_TIMEOUT_S,
        )


def _micro(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """One replica leads while it holds the Lease; :meth:`leading` says whether this one does.

    ``clock`` is monotonic: it times this replica's own lease and how long it has seen
    another's unchanged; ``wall`` only stamps the record's times, for people reading them."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        duration: float = LEASE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._coordination = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration, self.clock, self.wall = duration, clock, wall
        self._until = 0.0  # this replica leads until then (its last renewal + the duration)
        self._observed: tuple[Any, ...] | None = None  # the record as last read
        self._observed_at = 0.0  # when this replica saw it change, on its own clock
        self._observed_for = 0.0  # the duration it claims, within bounds

    def leading(self) -> bool:
        return self.clock() < self._until

    async def run(self) -> None:
        """Try to acquire or renew every third of the lease's duration, until cancelled."""
        was = False
        while True:
            try:
                await asyncio.to_thread(self.try_once)
            except (client.ApiException, HTTPError, ValueError) as exc:
                log_event(
                    logger,
                    logging.WARNING,
                    "lease renewal failed",
                    lease=self.name,
                    reason=str(exc).splitlines()[0][:200],
                )
            if self.leading() != was:
                was = self.leading()
                log_event(
                    logger,
                    logging.INFO,
                    "leader" if was else "standby",
                    lease=self.name,
                    identity=self.identity,
                )
            await asyncio.sleep(self.duration / 3)

    def _held_for(self, spec: dict[str, Any], holder: str) -> float:
        """The record's duration, or this receiver's own where the record's is out of bounds
        (said once per record: a holder claiming years would block the election for years)."""
        claimed = spec.get("leaseDurationSeconds")
        low, high = LEASE_SECONDS_BOUNDS
        if type(claimed) is int and low <= claimed <= high:
            return float(claimed)
        log_event(
            logger,
            logging.WARNING,
            "lease duration out of bounds",
            lease=self.name,
            holder=holder[:200],
            value=repr(claimed)[:40],
            bounds=f"{low}..{high}",
            using=self.duration,
        )
        return self.duration

    def _held_by_another(self, current: dict[str, Any] | None, now: float) -> bool:
        """Whether another replica holds the record read: one seen to change restarts the
        wait, as client-go's observedTime does; the record's own times are not trusted."""
        if current is None:
            return False
        spec = current.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        seen = (
            (current.get("metadata") or {}).get("resourceVersion"),
            holder,
            spec.get("renewTime"),
            spec.get("leaseDurationSeconds"),
        )
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
            self._observed_for = self._held_for(spec, holder) if holder else 0.0
        if not holder or holder == self.identity:
            return False
        return now < self._observed_at + self._observed_for

    def try_once(self) -> bool:
        """One attempt to acquire or renew; whether this replica holds the lease now."""
        now, stamp = self.clock(), _micro(self.wall())
        try:
            current = body(
                self._coordination.read_namespaced_lease(
                    self.name,
                    self.namespace,
                    _preload_content=False,
                    _request_timeout=DEFAULT_TIMEOUT_S,
                )
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            current = None
        if self._held_by_another(current, now):
            self._until = 0.0
            return False  # another replica holds it, seen renewed within its duration
        spec = (current or {}).get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
        new_spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "acquireTime": spec.get("acquireTime") if holder == self.identity else stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions if current is not None else 0,
        }
        try:
            if current is None:
                self._coordination.create_namespaced_lease(
                    self.namespace,
                    cast(Any, {"metadata": {"name": self.name}, "spec": new_spec}),
                    _preload_content=False,
                    _request_timeout=DEFAULT_TIMEOUT_S,
                )
            else:
                meta = {
                    "name": self.name,
                    "resourceVersion": current["metadata"]["resourceVersion"],
                }
                self._coordination.replace_namespaced_lease(
                    self.name,
                    self.namespace,
                    cast(Any, {"metadata": meta, "spec": new_spec}),
                    _preload_content=False,
                    _request_timeout=DEFAULT_TIMEOUT_S,
                )
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            self._until = 0.0
            return False  # another replica wrote first
        # a margin below the duration, so that two replicas never both believe they lead
        self._until = now + self.duration * 2 / 3
        return True
