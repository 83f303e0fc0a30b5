"""A Kubernetes API server for just the endpoints the runbook actions use, over real HTTP.

No API server runs here, so the actions' tests and the fault drill (``inferwatch drill``)
drive the official client against this one.
It keeps the semantics the actions depend on: a cluster-wide ``resourceVersion`` that every
write increments (and a patch that changes nothing does not), a stale ``resourceVersion`` in
a patch or a failed delete precondition is ``409 Conflict``, requests outside the configured
RBAC rules are ``403 Forbidden``, a missing object is ``404 NotFound``, all answered with a
``Status`` body the way kube-apiserver words them. Patches are applied by content type: JSON
merge patch (RFC 7386), strategic merge patch (for the built-in kinds only; the fields the
actions patch are plain maps and atomic lists, where it equals a merge patch) and JSON patch
(RFC 6902). HTTPRoutes are validated against the Gateway API CRD's schema after each patch
when a CRD file is given (:func:`httproute_validator`; it needs ``jsonschema``), else only
kept as written. Collections are listed by equality-based label selector (``a=b``, ``a!=b``,
``a``, ``!a``, comma-separated) with ``limit`` (a longer list carries a ``continue`` token);
ConfigMaps and Leases are created (an existing name is ``409 AlreadyExists``) and replaced
with the ``resourceVersion`` read (a stale one is ``409 Conflict``), as the receiver's state
store and leader election use them.
Endpoints:

    GET         /api/v1/nodes  (list)
    GET/PATCH   /api/v1/nodes/{name}
    GET         /api/v1/namespaces/{ns}/pods  (list)
    GET/DELETE  /api/v1/namespaces/{ns}/pods/{name}
    POST        /api/v1/namespaces/{ns}/configmaps
    GET/PUT     /api/v1/namespaces/{ns}/configmaps/{name}
    POST        /apis/coordination.k8s.io/v1/namespaces/{ns}/leases
    GET/PUT     /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}
    GET/PATCH   /apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes/{name}
"""

from __future__ import annotations

import copy
import datetime
import json
import re
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from inferwatch import config as layer
from inferwatch.serving import threaded

#: kube-apiserver's limit on a request body
MAX_BODY = 3 * 1024 * 1024
GATEWAY_GROUP = "gateway.networking.k8s.io"
LEASE_GROUP = "coordination.k8s.io"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

_PATHS = (
    (re.compile(r"^/api/v1/nodes(?:/([^/]+))?$"), "", "nodes", "Node"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?$"), "", "pods", "Pod"),
    (
        re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps(?:/([^/]+))?$"),
        "",
        "configmaps",
        "ConfigMap",
    ),
    (
        re.compile(rf"^/apis/{re.escape(LEASE_GROUP)}/v1/namespaces/([^/]+)/leases(?:/([^/]+))?$"),
        LEASE_GROUP,
        "leases",
        "Lease",
    ),
    (
        re.compile(rf"^/apis/{re.escape(GATEWAY_GROUP)}/v1/namespaces/([^/]+)/httproutes/([^/]+)$"),
        GATEWAY_GROUP,
        "httproutes",
        "HTTPRoute",
    ),
)
_ALLOWED = {
    "nodes": {"get", "patch", "list"},
    "pods": {"get", "delete", "list"},
    "configmaps": {"get", "create", "update"},
    "leases": {"get", "create", "update"},
    "httproutes": {"get", "patch"},
}
_API_VERSION = {"configmaps": "v1", "leases": f"{LEASE_GROUP}/v1"}

Key = tuple[str, str, str]  # resource, namespace ("" for cluster scope), name


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    content_type: str
    status: int


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 ``add``, ``remove``, ``replace`` and ``test`` (all the actions could send)."""
    if not isinstance(operations, list):
        raise ApiError(400, "BadRequest", "json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "path" not in op:
            raise ApiError(400, "BadRequest", f"invalid json patch operation {op!r}")
        *parents, last = _pointer(op["path"]) or [""]
        node = doc
        try:
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            kind = op.get("op")
            if kind == "test":
                current = node[int(last)] if isinstance(node, list) else node[last]
                if current != op.get("value"):
                    raise ApiError(422, "Invalid", f"testing value {op['path']} failed")
            elif kind == "remove":
                del node[int(last) if isinstance(node, list) else last]
            elif kind == "add" and isinstance(node, list):
                index = len(node) if last == "-" else int(last)
                node.insert(index, copy.deepcopy(op["value"]))
            elif kind in ("add", "replace"):
                if kind == "replace" and (
                    (isinstance(node, list) and int(last) >= len(node))
                    or (isinstance(node, dict) and last not in node)
                ):
                    raise ApiError(
                        422, "Invalid", f"replace operation does not apply: {op['path']}"
                    )
                node[int(last) if isinstance(node, list) else last] = copy.deepcopy(op["value"])
            else:
                raise ApiError(400, "BadRequest", f"unsupported json patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"json patch {op['path']}: {exc!r}") from None
    return doc


def httproute_validator(crd_path: str) -> Callable[[Mapping[str, Any]], None]:
    """Checks an HTTPRoute against the v1 schema of the Gateway API CRD file (read in place)."""
    # only where a schema is checked: a test dependency, not the drill's
    import jsonschema  # type: ignore[import-untyped, unused-ignore]

    crd = layer.load(crd_path)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    validator = jsonschema.Draft202012Validator(version["schema"]["openAPIV3Schema"])

    def validate(obj: Mapping[str, Any]) -> None:
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            causes = [
                {"field": ".".join(str(p) for p in e.absolute_path), "message": e.message}
                for e in errors
            ]
            name = obj.get("metadata", {}).get("name", "")
            raise ApiError(
                422,
                "Invalid",
                f'HTTPRoute.{GATEWAY_GROUP} "{name}" is invalid: {causes[0]["field"]}: '
                f"{causes[0]['message']}",
                name=name,
                group=GATEWAY_GROUP,
                kind="HTTPRoute",
                causes=causes,
            )

    return validate


def parse_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """An equality-based label selector (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``)."""
    terms: list[tuple[str, str, str]] = []  # (op, key, value)
    for term in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append(("!=", key.strip(), value.strip()))
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append(("=", key.strip(), value.strip()))
        elif re.fullmatch(r"!?[A-Za-z0-9./_-]+", term):
            terms.append(("!", term[1:], "") if term.startswith("!") else ("exists", term, ""))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")

    def matches(labels: Mapping[str, str]) -> bool:
        for op, key, value in terms:
            found = labels.get(key)
            if (
                (op == "=" and found != value)
                or (op == "!=" and found == value)
                or (op == "!" and key in labels)
                or (op == "exists" and key not in labels)
            ):
                return False
        return True

    return matches


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKube:
    """The store, the rules and the HTTP server (see the module docstring).

    ``rules`` are RBAC PolicyRules (``apiGroups``, ``resources``, ``verbs``) for the one
    service account every request is taken to come from; ``None`` allows everything.
    ``after_read`` runs after each GET is answered, so a test can play a second writer.
    :meth:`line_up_reads` makes the next GETs wait for each other, to line up two receivers.
    """

    USER = "system:serviceaccount:inferwatch:runbooks"

    def __init__(
        self, validate_httproute: Callable[[Mapping[str, Any]], None] | None = None
    ) -> None:
        self._validate_httproute = validate_httproute or (lambda obj: None)
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._version = 1000
        self.rules: Sequence[Mapping[str, Any]] | None = None
        self.after_read: Callable[[Key], None] | None = None
        self._barrier: threading.Barrier | None = None
        self._lined_up = 0
        self.requests: list[Request] = []
        #: every object as a write left it, in order
        self.written: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None

    # -- store -------------------------------------------------------------------------

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _put(self, key: Key, obj: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            meta = obj.setdefault("metadata", {})
            meta["name"] = key[2]
            if key[1]:
                meta["namespace"] = key[1]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            if key[0] == "httproutes":
                meta.setdefault("generation", 1)
            meta["resourceVersion"] = self._next_version()
            if key[0] == "httproutes":
                self._validate_httproute(obj)
            self._objects[key] = copy.deepcopy(obj)
            return copy.deepcopy(obj)

    def add_node(
        self,
        name: str,
        *,
        taints: Sequence[Mapping[str, str]] = (),
        unschedulable: bool = False,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"providerID": f"fake://{name}"}
        if taints:
            spec["taints"] = [dict(t) for t in taints]
        if unschedulable:
            spec["unschedulable"] = True
        meta: dict[str, Any] = {
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        }
        node = {"kind": "Node", "apiVersion": "v1", "metadata": meta, "spec": spec}
        return self._put(("nodes", "", name), node)

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str = "",
        created: str = "",
        labels: Mapping[str, str] | None = None,
        ip: str = "",
    ) -> dict[str, Any]:
        status: dict[str, Any] = {"phase": "Running"}
        if ip:
            status["podIP"] = ip
        pod: dict[str, Any] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "creationTimestamp": created or _now(),
                "labels": {"app": "engine", **(labels or {})},
            },
            "spec": {"nodeName": node, "containers": [{"name": "engine", "image": "vllm"}]},
            "status": status,
        }
        return self._put(("pods", namespace, name), pod)

    def add_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
        configmap = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {}, "data": dict(data)}
        return self._put(("configmaps", namespace, name), configmap)

    def add_httproute(self, namespace: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        route = {
            "kind": "HTTPRoute",
            "apiVersion": f"{GATEWAY_GROUP}/v1",
            "metadata": {},
            "spec": copy.deepcopy(dict(spec)),
        }
        return self._put(("httproutes", namespace, name), route)

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self._objects.get((resource, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def remove(self, resource: str, namespace: str, name: str) -> None:
        """What the kubelet does once a deleted pod has terminated."""
        with self._lock:
            self._objects.pop((resource, namespace, name), None)

    def touch(self, key: Key) -> None:
        """Another writer changes the object (a kubelet status update): a new resourceVersion."""
        with self._lock:
            self._objects[key]["metadata"]["resourceVersion"] = self._next_version()

    def line_up_reads(self, parties: int) -> None:
        """The next ``parties`` GETs read the object, then are answered only once all of them
        have read it: they see one resourceVersion, however late each thread runs."""
        with self._lock:
            self._barrier, self._lined_up = threading.Barrier(parties), parties

    def count(self, method: str, status: int | None = None) -> int:
        return sum(1 for r in self.requests if r.method == method and status in (None, r.status))

    # -- request handling ---------------------------------------------------------------

    def _route(self, path: str) -> tuple[str, str, Key]:
        """The group, kind and key of a path; a collection's key has the name ``""``."""
        for pattern, group, resource, kind in _PATHS:
            match = pattern.match(path)
            if match:
                parts = match.groups()
                namespace, name = ("", parts[0]) if len(parts) == 1 else parts
                return group, kind, (resource, namespace or "", name or "")
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _authorize(self, group: str, verb: str, key: Key) -> None:
        resource, namespace, name = key
        if self.rules is None:
            return
        for rule in self.rules:
            if (
                group in rule.get("apiGroups", ())
                and resource in rule.get("resources", ())
                and verb in rule.get("verbs", ())
            ):
                return
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        raise ApiError(
            403,
            "Forbidden",
            f'{resource} "{name}" is forbidden: User "{self.USER}" cannot {verb} resource '
            f'"{resource}" in API group "{group}" {scope}',
            name=name,
            group=group,
            kind=resource,
        )

    def _not_found(self, group: str, key: Key) -> ApiError:
        resource, _, name = key
        qualified = f"{resource}.{group}" if group else resource
        return ApiError(
            404,
            "NotFound",
            f'{qualified} "{name}" not found',
            name=name,
            group=group,
            kind=resource,
        )

    @staticmethod
    def _check_version(group: str, key: Key, current: dict[str, Any], wanted: Any) -> None:
        """A write naming another resourceVersion than the stored one is refused with 409
        Conflict, as kube-apiserver refuses it (optimistic concurrency); none named wins."""
        if wanted is None or wanted == current["metadata"]["resourceVersion"]:
            return
        resource, _, name = key
        raise ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            name=name,
            group=group,
            kind=resource,
        )

    def handle(
        self, method: str, path: str, content_type: str, body: bytes, query: str = ""
    ) -> dict[str, Any]:
        group, kind, key = self._route(path)
        collection = key[2] == ""
        verb = {
            ("GET", False): "get",
            ("GET", True): "list",
            ("PATCH", False): "patch",
            ("DELETE", False): "delete",
            ("POST", True): "create",
            ("PUT", False): "update",
        }.get((method, collection), "")
        if verb not in _ALLOWED[key[0]]:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not served for {key[0]} here")
        self._authorize(group, verb, key)
        if verb == "list":
            return self._list(kind, key, urllib.parse.parse_qs(query))
        if verb == "create":
            return self._create(group, kind, key, body)
        if verb == "update":
            return self._update(group, kind, key, body)
        if method == "GET":
            with self._lock:
                barrier = self._barrier if self._lined_up > 0 else None
                self._lined_up -= 1 if barrier else 0
            found = self.get(*key)
            if barrier is not None:  # read first: a party released late must not read later
                barrier.wait(timeout=30)
            if found is None:
                raise self._not_found(group, key)
            return found
        if method == "DELETE":
            return self._delete(group, key, body)
        return self._patch(group, kind, key, content_type, body)

    def _list(self, kind: str, key: Key, query: Mapping[str, list[str]]) -> dict[str, Any]:
        resource, namespace, _ = key
        selector = parse_selector((query.get("labelSelector") or [""])[0])
        limit = int((query.get("limit") or ["0"])[0] or 0)
        with self._lock:
            found = [
                copy.deepcopy(obj)
                for (r, ns, _), obj in sorted(self._objects.items())
                if r == resource
                and (not namespace or ns == namespace)
                and selector((obj.get("metadata") or {}).get("labels") or {})
            ]
            version = str(self._version)
        meta: dict[str, Any] = {"resourceVersion": version}
        if limit and len(found) > limit:
            found, meta["continue"] = found[:limit], f"after-{limit}"
        return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": meta, "items": found}

    def _create(self, group: str, kind: str, key: Key, body: bytes) -> dict[str, Any]:
        obj = self._decode(body)
        if not isinstance(obj, dict) or not (obj.get("metadata") or {}).get("name"):
            raise ApiError(422, "Invalid", f"{kind} metadata.name: Required value")
        name = obj["metadata"]["name"]
        target = (key[0], key[1], name)
        with self._lock:
            exists = target in self._objects
        if exists:
            raise ApiError(409, "AlreadyExists", f'{key[0]} "{name}" already exists',
                           name=name, group=group, kind=key[0])  # fmt: skip
        obj["metadata"].pop("resourceVersion", None)
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", _API_VERSION.get(key[0], "v1"))
        created = self._put(target, obj)
        with self._lock:
            self.written.append(copy.deepcopy(created))
        return created

    def _update(self, group: str, kind: str, key: Key, body: bytes) -> dict[str, Any]:
        obj = self._decode(body)
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the request body is not an object")
        meta = obj.get("metadata") or {}
        with self._lock:
            current = self._objects.get(key)
            if current is None:
                raise self._not_found(group, key)
            self._check_version(group, key, current, meta.get("resourceVersion"))
            kept = {f: current["metadata"][f] for f in ("uid", "creationTimestamp")}
            obj["metadata"] = {**meta, **kept, "name": key[2], "namespace": key[1]}
            obj["metadata"]["resourceVersion"] = self._next_version()
            obj.setdefault("kind", kind)
            obj.setdefault("apiVersion", _API_VERSION.get(key[0], "v1"))
            self._objects[key] = copy.deepcopy(obj)
            self.written.append(copy.deepcopy(obj))
            return copy.deepcopy(obj)

    def _decode(self, body: bytes) -> Any:
        try:
            return json.loads(body) if body else None
        except ValueError:
            raise ApiError(400, "BadRequest", "the request body is not valid JSON") from None

    def _patch(
        self, group: str, kind: str, key: Key, content_type: str, body: bytes
    ) -> dict[str, Any]:
        media = content_type.split(";")[0].strip().lower()
        if media not in (MERGE, STRATEGIC, JSON_PATCH):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {media}",
            )
        if media == STRATEGIC and group:
            # kube-apiserver has no patch strategy for custom resources
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "strategic merge patch is not supported for custom resources",
            )
        patch = self._decode(body)
        with self._lock:
            current = self._objects.get(key)
            if current is None:
                raise self._not_found(group, key)
            patched: Any = (
                json_patch(current, patch) if media == JSON_PATCH else merge_patch(current, patch)
            )
            if not isinstance(patched, dict):
                raise ApiError(422, "Invalid", "the patched object is not an object")
            meta: dict[str, Any] = (
                patched["metadata"] if isinstance(patched.get("metadata"), dict) else {}
            )
            self._check_version(group, key, current, meta.get("resourceVersion"))
            for field in ("name", "namespace", "uid", "creationTimestamp"):
                if meta.get(field) != current["metadata"].get(field):
                    raise ApiError(422, "Invalid", f"{kind} metadata.{field}: field is immutable")
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            patched["metadata"] = meta
            if patched == current:
                return copy.deepcopy(current)  # a no-op write keeps the resourceVersion
            if key[0] == "httproutes":
                self._validate_httproute(patched)
            if key[0] == "httproutes" and patched.get("spec") != current.get("spec"):
                meta["generation"] = int(current["metadata"].get("generation", 1)) + 1
            meta["resourceVersion"] = self._next_version()
            self._objects[key] = patched
            self.written.append(copy.deepcopy(patched))
            return copy.deepcopy(patched)

    def _delete(self, group: str, key: Key, body: bytes) -> dict[str, Any]:
        options = self._decode(body) or {}
        preconditions = options.get("preconditions") or {} if isinstance(options, dict) else {}
        with self._lock:
            current = self._objects.get(key)
            if current is None:
                raise self._not_found(group, key)
            meta = current["metadata"]
            for field in ("uid", "resourceVersion"):
                wanted = preconditions.get(field)
                if wanted is not None and wanted != meta.get(field):
                    raise ApiError(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on {key[0]} "{key[2]}": Precondition '
                        f"failed: {field.upper() if field == 'uid' else field} in precondition: "
                        f"{wanted}, {field} in object meta: {meta.get(field)}",
                        name=key[2],
                        kind=key[0],
                    )
            if "deletionTimestamp" not in meta:
                # graceful deletion: the pod stays, terminating, until the kubelet is done
                meta["deletionTimestamp"] = _now()
                meta["deletionGracePeriodSeconds"] = int(options.get("gracePeriodSeconds", 30))
                meta["resourceVersion"] = self._next_version()
            return copy.deepcopy(current)

    # -- HTTP --------------------------------------------------------------------------

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on a free loopback port; yields the base URL for ``Configuration.host``."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # headers and body go out in two writes: without this, Nagle's algorithm
                # and the client's delayed ACK add 40 ms to every answer
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _answer(self) -> None:
                path, _, query = self.path.partition("?")
                content_type = self.headers.get("Content-Type", "")
                length = int(self.headers.get("Content-Length") or 0)
                key: Key | None = None
                try:
                    if length > MAX_BODY:
                        # read (bounded) and drop it, so the client sees the answer
                        # rather than a reset; the connection is not reused
                        left = min(length, 2 * MAX_BODY)
                        while left > 0 and (chunk := self.rfile.read(min(left, 65536))):
                            left -= len(chunk)
                        self.close_connection = True
                        raise ApiError(413, "RequestEntityTooLarge", "request entity too large")
                    body = self.rfile.read(length) if length else b""
                    result = fake.handle(self.command, path, content_type, body, query)
                    code = 200 if self.command != "POST" else 201
                    if self.command == "GET" and fake._route(path)[2][2]:
                        key = fake._route(path)[2]
                except ApiError as error:
                    result, code = error.status(), error.code
                payload = json.dumps(result).encode()
                fake.requests.append(Request(self.command, path, content_type, code))
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                if key is not None and fake.after_read is not None:
                    fake.after_read(key)

            do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _answer

        with threaded.serving(Handler, "fake-kube") as url:
            yield url
