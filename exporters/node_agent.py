"""``inferwatch node-agent``: the one pod on a node that reads the kubelet's PodResources API.

An inference pod that mounted the kubelet's socket (a hostPath) would fail the Pod Security
"baseline" level, so the sidecars ask this agent instead (``--gpu-scope agent``, client in
``exporters/gpu/node_agent.py``). It runs as a DaemonSet in a namespace of its own, answers
``GET /v1/pods/NAMESPACE/POD/gpus`` only to callers with the shared bearer token, and says
which node it runs on so that a sidecar refuses an answer from another node. Each request is
one kubelet call with the client's timeout; the kubelet's failures come back as a 503 with
the client's reason (``pod_not_found``, ``timeout``, ...), which the sidecar keeps as the
reason its GPU readiness fails.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Protocol

import click
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inferwatch import catalog
from inferwatch.auth import TokenError, bearer_ok, load_token
from inferwatch.clikit import bind, parse_listen
from inferwatch.exporters.gpu.node_agent import allocation_path
from inferwatch.exporters.gpu.podresources import Allocation, PodResourcesError
from inferwatch.exporters.gpu.scope import KUBELET_SOCKET
from inferwatch.logs import log_event
from inferwatch.serving import endpoints, uvicorn_server
from inferwatch.serving.readiness import Condition

logger = logging.getLogger("inferwatch.node_agent")

__all__ = ["Allocations", "app", "node_agent"]

TOKEN_ENV = "INFERWATCH_NODE_AGENT_TOKEN"


class Allocations(Protocol):
    """Where the agent reads allocations: the kubelet's client, or a stand-in in tests."""

    def allocation(self, pod: str, namespace: str) -> Allocation: ...


def app(kubelet: Allocations, token: str, node: str, socket: Path | None = None) -> Starlette:
    """The agent's routes; ``socket`` (when given) must exist for /readyz to pass."""
    lookups: Counter[str] = Counter()

    async def gpus(request: Request) -> Response:
        if not bearer_ok(request.headers.get("authorization"), token):
            lookups["unauthorized"] += 1
            return JSONResponse({"reason": "unauthorized"}, status_code=401)
        namespace, pod = request.path_params["namespace"], request.path_params["pod"]
        try:
            allocation_path(namespace, pod)
        except ValueError as exc:
            lookups["bad_pod"] += 1
            return JSONResponse({"reason": "bad_pod", "detail": str(exc)}, status_code=400)
        try:
            found = await run_in_threadpool(kubelet.allocation, pod, namespace)
        except PodResourcesError as error:
            lookups[error.reason] += 1
            status = 404 if error.reason == "pod_not_found" else 503
            return JSONResponse({"reason": error.reason, "detail": error.detail}, status)
        lookups["ok"] += 1
        return JSONResponse(
            {"node": node, "namespace": namespace, "pod": pod, "device_ids": found.device_ids}
        )

    async def readyz(request: Request) -> Response:
        ok = socket is None or socket.is_socket()
        reason = "" if ok else f"no kubelet PodResources socket at {socket}"
        return endpoints.readiness_response([Condition("kubelet_socket", ok, reason)])

    async def metrics(request: Request) -> Response:
        family = catalog.load().family("node_agent_lookups")
        for outcome, count in sorted(lookups.items()):
            family.add_metric([outcome], count)
        return endpoints.metrics_response(request, [family])

    return Starlette(
        routes=[
            Route("/v1/pods/{namespace}/{pod}/gpus", gpus),
            Route("/metrics", metrics),
            Route("/healthz", endpoints.healthz),
            Route("/readyz", readyz),
        ]
    )


@click.command("node-agent")
@click.option("--listen", default=":9406", show_envvar=True, help="HOST:PORT to serve on.")
@click.option(
    "--kubelet-socket",
    type=click.Path(dir_okay=False, path_type=Path),
    default=KUBELET_SOCKET,
    show_envvar=True,
    help="The kubelet's PodResources socket (mount its directory read-only).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help=f"File holding the bearer token sidecars present (or ${TOKEN_ENV}).",
)
@click.option(
    "--node",
    default=lambda: os.environ.get("NODE_NAME", ""),
    show_envvar=True,
    help="This node's name, given in every answer so that sidecars refuse another node's.",
    show_default="$NODE_NAME (Kubernetes downward API)",
)
def node_agent(listen: str, kubelet_socket: Path, token_file: Path | None, node: str) -> None:
    """Tell each replica's sidecar on this node which GPUs the kubelet gave its pod."""
    from inferwatch.exporters.gpu.podresources import PodResourcesClient

    host, port = parse_listen(listen)
    try:
        token = load_token(os.environ.get(TOKEN_ENV), token_file, what="node agent token")
    except TokenError as exc:
        raise click.BadParameter(str(exc), param_hint="--token-file") from None
    if token is None:
        raise click.UsageError(f"the node agent needs a token: --token-file or ${TOKEN_ENV}")
    if not node:
        raise click.UsageError("--node (or $NODE_NAME) must name this node")
    renamed = [name for name in os.environ.get("NVIDIA_RESOURCE_NAMES", "").split(",") if name]
    kubelet = PodResourcesClient(kubelet_socket, resource_names=renamed)
    sock = bind((host, port))
    log_event(
        logger,
        logging.INFO,
        "node agent starting",
        listen="{}:{}".format(*sock.getsockname()[:2]),
        node=node,
        kubelet_socket=str(kubelet_socket),
    )
    uvicorn_server.serve(app(kubelet, token, node, kubelet_socket), sock)
