"""The Kubernetes API as the runbook actions use it, through the official ``kubernetes`` client.

Three things every Kubernetes action needs and does one way: a client (in-cluster service
account, a kubeconfig, or a plain URL), optimistic concurrency (read the object, compute a
JSON merge patch that carries the ``resourceVersion`` read, and on ``409 Conflict`` read again
and recompute, a bounded number of times), and API errors turned into a failed
:class:`~inferwatch.runbooks.actions.base.Outcome` with one clear line (``403`` names the RBAC
rule that is missing) instead of an exception. The client is synchronous, so calls run in a
worker thread and never block the receiver's event loop.

Every permission these actions use, nothing more, is
:data:`~inferwatch.runbooks.kube_facts.ACTIONS_RULES`: the deployment's ClusterRole is
generated from it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from kubernetes import client, config
from urllib3.exceptions import HTTPError

from inferwatch.runbooks.actions.base import ActionError, Alert, Outcome, Step, Unit

MERGE_PATCH = "application/merge-patch+json"
#: how often a conflicting write is re-read and retried before the step fails
DEFAULT_RETRIES = 5
#: (connect, read) seconds for each API call
DEFAULT_TIMEOUT_S = (5.0, 15.0)
#: Kubernetes object names (DNS subdomain) and label values as they appear in alert labels
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
#: how much of an API server's message an outcome carries
_MESSAGE_LIMIT = 300

Obj = dict[str, Any]


def connect(host: str | None = None, *, kubeconfig: str | None = None) -> client.ApiClient:
    """A client: ``host`` as given (plain URL, no credentials), else a kubeconfig, else in-cluster.

    Inside a pod with no kubeconfig named, the pod's service account is used, which is how
    the receiver runs in a cluster. A configuration that cannot be loaded is a ``ValueError``
    with one line.
    """
    configuration = client.Configuration()
    try:
        if host is not None:
            configuration.host = host
        elif kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
    except (config.ConfigException, OSError) as exc:
        raise ValueError(f"kubernetes client configuration: {exc}") from None
    return client.ApiClient(configuration)


def client_for(
    api: client.ApiClient | None, host: str | None, kubeconfig: str | None
) -> client.ApiClient:
    """The client an action was given, else one from its settings (see :func:`connect`)."""
    return api if api is not None else connect(host, kubeconfig=kubeconfig)


class KubernetesAction:
    """What every Kubernetes action is built with: its API client and its retries."""

    def __init__(
        self,
        api: client.ApiClient | None = None,
        *,
        host: str | None = None,
        kubeconfig: str | None = None,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        """Settings: ``host`` or ``kubeconfig`` (else in-cluster), ``retries`` on 409."""
        self._api = client_for(api, host, kubeconfig)
        self._retries = retries


class NodeAction(KubernetesAction):
    """An action on the node an alert names (its ``node`` label): node isolation and GPU reset
    requests plan their one step from that label and change or read the node the same way, so
    what they share is written here once.

    The step's ``desired`` carries the node, the alert's fingerprint (revert undoes only what
    this alert asked for) and its reason (what the node's annotations say).
    """

    name: ClassVar[str]
    PARAMS: ClassVar[frozenset[str]]

    def _node_of(self, alert: Alert, params: Mapping[str, Any]) -> str:
        """The alert's node, once the parameters are known ones (:class:`ActionError` if not)."""
        check_params(params, self.PARAMS, self.name)
        return object_name(alert.labels.get("node"), "alert label node")

    def _step(
        self,
        alert: Alert,
        node: str,
        target: str,
        unit: Unit,
        group: str,
        fields: Mapping[str, Any],
    ) -> Step:
        """The one step on ``node``: its ``desired`` is ``fields`` with the node, fingerprint and
        reason; ``group`` is the inventory population the receiver counts it against."""
        reason = alert_reason(alert)
        desired = {"node": node, **fields, "fingerprint": alert.fingerprint, "reason": reason}
        return Step(self.name, target, unit, group, desired, reason)

    async def _change_node(
        self,
        step: Step,
        change: Callable[[Obj], Obj | None],
        describe: Callable[[bool, Obj], str],
        observe: Callable[[Obj], Any],
    ) -> Outcome:
        """Apply ``change`` to the step's node (read-modify-write, retried on conflicts);
        ``describe`` says what happened (whether it patched, the node after), ``observe``
        what the outcome records of the node."""
        read, write = node_access(self._api, step.desired["node"])

        def work() -> Outcome:
            patch, node = read_modify_write(read, change, write, self._retries)
            changed = patch is not None
            return Outcome(
                True, changed, f"{step.target}: {describe(changed, node)}", observe(node)
            )

        return await call(step.target, work)

    async def _check_node(self, step: Step, judge: Callable[[Obj], Outcome]) -> Outcome:
        """``judge`` the step's node as it is now (API errors become outcomes)."""
        read, _ = node_access(self._api, step.desired["node"])
        return await call(step.target, lambda: judge(read()))


def object_name(value: object, what: str) -> str:
    """A Kubernetes object name from an alert label or parameter; :class:`ActionError` if not."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ActionError(f"{what} must be a Kubernetes object name, got {value!r}")
    return value


#: bytes of one API answer read at most (a node, a pod, a list of MAX_ENTRIES fit easily)
MAX_ANSWER_BYTES = 16 * 1024 * 1024


def body(response: Any, limit: int = MAX_ANSWER_BYTES) -> Obj:
    """The JSON object of a raw (``_preload_content=False``) client response, read up to
    ``limit`` bytes (``ValueError`` beyond)."""
    data = response.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"the API server's answer is larger than {limit} bytes")
    decoded = json.loads(data)
    if not isinstance(decoded, dict):
        raise ValueError("the API server answered with something other than an object")
    return decoded


class ConflictsExhausted(Exception):
    """Every attempt of a read-modify-write lost to another writer."""

    def __init__(self, attempts: int) -> None:
        super().__init__(f"gave up after {attempts} conflicting writes (409)")


def read_modify_write(
    read: Callable[[], Obj],
    change: Callable[[Obj], Obj | None],
    write: Callable[[Obj], Obj],
    retries: int = DEFAULT_RETRIES,
) -> tuple[Obj | None, Obj]:
    """Apply ``change`` (current object → merge patch, ``None`` when already as wanted).

    The patch is sent with the ``resourceVersion`` it was computed from, so a write based on
    a stale read fails with 409 and is recomputed from a fresh read; a second receiver that
    lost the race therefore finds the work done and writes nothing. Returns the patch sent
    (``None`` for a no-op) and the object as the server last returned it.
    """
    for _ in range(retries + 1):
        current = read()
        patch = change(current)
        if patch is None:
            return None, current
        metadata = dict(patch.get("metadata") or {})
        metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        try:
            return patch, write({**patch, "metadata": metadata})
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    raise ConflictsExhausted(retries + 1)


def failure(exc: Exception, target: str) -> Outcome:
    """The failed outcome for an error of the API or the connection to it."""
    if isinstance(exc, ConflictsExhausted):
        return Outcome(False, False, f"{target}: {exc}")
    if isinstance(exc, client.ApiException):
        message = _status_message(exc)
        hint = {
            403: "forbidden (the service account lacks an RBAC rule; see runbooks/kube_facts.py)",
            404: "not found",
            409: "conflict",
            422: "rejected as invalid",
        }.get(int(exc.status or 0), f"HTTP {exc.status}")
        return Outcome(False, False, f"{target}: {hint}: {message}", {"status": exc.status})
    if isinstance(exc, HTTPError):
        return Outcome(False, False, f"{target}: API server unreachable: {exc}"[:_MESSAGE_LIMIT])
    return Outcome(False, False, f"{target}: unreadable API answer: {exc}"[:_MESSAGE_LIMIT])


def _status_message(exc: client.ApiException) -> str:
    try:
        status = json.loads(exc.body or "")
        message = status.get("message") if isinstance(status, dict) else None
    except ValueError:
        message = None
    return str(message or exc.reason or "")[:_MESSAGE_LIMIT]


async def call(target: str, work: Callable[[], Outcome]) -> Outcome:
    """Run blocking client work in a thread; API and connection errors become outcomes."""
    try:
        return await asyncio.to_thread(work)
    except (client.ApiException, ConflictsExhausted, HTTPError, ValueError, ActionError) as exc:
        return failure(exc, target)


def node_access(api: client.ApiClient, name: str) -> tuple[Callable[[], Obj], Callable[[Obj], Obj]]:
    """Read and merge-patch one node, for :func:`read_modify_write`."""
    core = client.CoreV1Api(api)

    def read() -> Obj:
        return body(
            core.read_node(name, _preload_content=False, _request_timeout=DEFAULT_TIMEOUT_S)
        )

    def write(patch: Obj) -> Obj:
        response = core.patch_node(
            name,
            patch,
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=DEFAULT_TIMEOUT_S,
        )
        return body(response)

    return read, write


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def alert_reason(alert: Alert) -> str:
    """What an annotation written for ``alert`` says about why (bounded)."""
    labels = alert.labels
    parts = [labels.get("alertname", "alert")]
    if "xid" in labels:
        parts.append(f"XID {labels['xid']}")
    if "gpu_uuid" in labels:
        parts.append(f"on {labels['gpu_uuid']}")
    if "action" in labels:
        parts.append(f"({labels['action']})")
    return " ".join(parts)[:_MESSAGE_LIMIT]


def check_params(params: Mapping[str, Any], known: frozenset[str], action: str) -> None:
    """Refuse parameters ``action`` does not know (a typo would otherwise be ignored)."""
    unknown = sorted(set(params) - known)
    if unknown:
        raise ActionError(f"{action}: unknown parameters {', '.join(unknown)}")
