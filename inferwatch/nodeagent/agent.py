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

import asyncio
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import click
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inferwatch import catalog
from inferwatch.auth import bearer_ok
from inferwatch.clikit import (
    CannotRun,
    FiniteFloat,
    bind,
    downward_api_option,
    listen_option,
    parse_listen,
    required_token,
    token_file_option,
)
from inferwatch.exporters.gpu.node_agent import allocation_path
from inferwatch.exporters.gpu.podresources import Allocation, PodResourcesError
from inferwatch.exporters.sources.gpu import kubelet_socket_option
from inferwatch.logs import log_event
from inferwatch.nodeagent import gpu_reset
from inferwatch.nodeagent.kube_facts import SIDECAR_TOKEN_ENV
from inferwatch.serving import endpoints, uvicorn_server
from inferwatch.serving.readiness import Condition

if TYPE_CHECKING:
    from inferwatch.nodeagent.gpu_reset import ResetAgent

logger = logging.getLogger("inferwatch.node_agent")

__all__ = ["Allocations", "app", "node_agent"]

TOKEN_ENV = "INFERWATCH_NODE_AGENT_TOKEN"


class Allocations(Protocol):
    """Where the agent reads allocations: the kubelet's client, or a stand-in in tests."""

    def allocation(self, pod: str, namespace: str) -> Allocation: ...


def app(
    kubelet: Allocations,
    token: str,
    node: str,
    socket: Path | None = None,
    reset: ResetAgent | None = None,
    reset_interval_s: float = gpu_reset.DEFAULT_INTERVAL_S,
) -> Starlette:
    """The agent's routes; ``socket`` (when given) must exist for /readyz to pass; ``reset``
    (when given) carries out the node's GPU reset requests in the background."""
    lookups: Counter[str] = Counter()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        job = asyncio.create_task(reset.run(reset_interval_s)) if reset is not None else None
        yield
        if job is not None:
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)

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
        cat = catalog.load()
        family = cat.family("node_agent_lookups")
        for outcome, count in sorted(lookups.items()):
            family.add_metric([outcome], count)
        families = [family]
        if reset is not None:
            ignored = cat.family("node_agent_gpu_reset_ignored")
            ignored.add_metric([], reset.ignored_total)
            families.append(ignored)
        return endpoints.metrics_response(request, families)

    return Starlette(
        routes=[
            Route("/v1/pods/{namespace}/{pod}/gpus", gpus),
            Route("/metrics", metrics),
            Route("/healthz", endpoints.healthz),
            Route("/readyz", readyz),
        ],
        lifespan=lifespan,
    )


@click.command("node-agent")
@listen_option(":9406")
@kubelet_socket_option("read-only")
@token_file_option(
    "--token-file", f"File holding the bearer token sidecars present (or ${TOKEN_ENV})."
)
@downward_api_option(
    "--node",
    "NODE_NAME",
    "This node's name, given in every answer so that sidecars refuse another node's.",
    say_where=True,
)
@click.option(
    "--gpu-reset/--no-gpu-reset",
    default=False,
    show_envvar=True,
    help="Carry out the runbook receiver's GPU reset requests on this node (docs/sidecar.md): "
    "needs the Kubernetes API (nodes get/patch, pods list), nvidia-smi and the GPUs.",
)
@click.option(
    "--gpu-reset-dry-run", is_flag=True, show_envvar=True,
    help="Log what each reset request would do; drain and reset nothing.",
)  # fmt: skip
@click.option(
    "--gpu-reset-cooldown",
    type=FiniteFloat(min=0),
    default=gpu_reset.DEFAULT_COOLDOWN_S,
    show_default=True,
    show_envvar=True,
    help="Seconds before a GPU's reset is tried again.",
)
@token_file_option(
    "--sidecar-token-file",
    f"File holding the sidecars' admin token, to drain a GPU's replicas (or ${SIDECAR_TOKEN_ENV}).",
)
def node_agent(
    listen: str,
    kubelet_socket: Path,
    token_file: Path | None,
    node: str,
    gpu_reset: bool,
    gpu_reset_dry_run: bool,
    gpu_reset_cooldown: float,
    sidecar_token_file: Path | None,
) -> None:
    """Tell each replica's sidecar on this node which GPUs the kubelet gave its pod, and
    (with --gpu-reset) carry out the GPU resets the runbook receiver requests."""
    from inferwatch.exporters.gpu.podresources import PodResourcesClient

    host, port = parse_listen(listen)
    token = required_token(
        os.environ.get(TOKEN_ENV),
        token_file,
        "--token-file",
        what="node agent token",
        missing=f"the node agent needs a token: --token-file or ${TOKEN_ENV}",
    )
    if not node:
        raise click.UsageError("--node (or $NODE_NAME) must name this node")
    renamed = [name for name in os.environ.get("NVIDIA_RESOURCE_NAMES", "").split(",") if name]
    kubelet = PodResourcesClient(kubelet_socket, resource_names=renamed)
    reset = (
        _reset_agent(node, kubelet, sidecar_token_file, gpu_reset_dry_run, gpu_reset_cooldown)
        if gpu_reset
        else None
    )
    sock = bind((host, port))
    log_event(
        logger,
        logging.INFO,
        "node agent starting",
        listen="{}:{}".format(*sock.getsockname()[:2]),
        node=node,
        kubelet_socket=str(kubelet_socket),
        gpu_reset="dry-run" if reset and gpu_reset_dry_run else "on" if reset else "off",
    )
    uvicorn_server.serve(app(kubelet, token, node, kubelet_socket, reset), sock)


def _reset_agent(
    node: str, kubelet: Allocations, token_file: Path | None, dry_run: bool, cooldown_s: float
) -> ResetAgent:
    """The GPU reset agent, with this node's API access, NVML and the sidecars' token."""
    token = required_token(
        os.environ.get(SIDECAR_TOKEN_ENV),
        token_file,
        "--sidecar-token-file",
        what="sidecar token",
        missing=f"--gpu-reset needs --sidecar-token-file or ${SIDECAR_TOKEN_ENV}",
    )
    try:
        import kubernetes  # noqa: F401  the kubernetes extra
        import pynvml  # type: ignore[import-untyped]
    except ImportError as exc:
        raise CannotRun(f"--gpu-reset needs {exc.name}; install inferwatch[kubernetes]") from None
    try:
        api = gpu_reset.in_cluster()
        pynvml.nvmlInit()
    except (ValueError, pynvml.NVMLError) as exc:
        raise CannotRun(f"--gpu-reset: {exc}") from None
    return gpu_reset.ResetAgent(
        node,
        gpu_reset.KubernetesNode(api, node),
        gpu_reset.NvmlGpus(pynvml),
        gpu_reset.KubeletReplicas(api, kubelet, node),
        token,
        dry_run=dry_run,
        cooldown_s=cooldown_s,
    )
