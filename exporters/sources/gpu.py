"""The GPU source: the telemetry backend (NVML, dcgm-exporter, a replay) of the replica's GPUs."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from inferwatch.clikit import F, required_token, token_file_option
from inferwatch.exporters import gpu
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.gpu import GpuTelemetry, scope
from inferwatch.exporters.gpu.node_agent import NodeAgentClient
from inferwatch.exporters.gpu.scope import GpuScope
from inferwatch.exporters.registry import Built, Registration, Setup


def build(setup: Setup) -> Built:
    """Always a backend, so the gpu collector's success is served (``--gpu none`` makes one
    that reports GPU telemetry off)."""
    options = setup.options
    spec, gpu_scope = options["gpu"], options["gpu_scope"]
    if setup.source("engine", EngineCollector) is None:
        gpu_scope = _gpu_only_scope(spec, gpu_scope)
    gpus = None
    if spec != "none":
        agent = _node_agent(options)
        gpus = _gpu_scope(
            gpu_scope, options["kubelet_socket"], options["pod"], options["namespace"], agent
        )
    backend = _gpu_backend(spec, gpus)
    return Built([backend], log={"gpu": spec, "gpu_scope": str(backend.scope)})


def _gpu_only_scope(spec: str, gpu_scope: str) -> str:
    """The GPU scope of a sidecar without an engine, or the one-line reason it cannot run.

    Such a sidecar serves no traffic: it reads every GPU of its node and gates no readiness
    on them.
    """
    if spec.strip() == "none":
        raise click.UsageError("--gpu none without --engine-url leaves nothing to serve")
    if gpu_scope not in ("auto", "node"):
        raise click.UsageError(
            f"--gpu-scope {gpu_scope} needs --engine-url: without an engine the sidecar reads "
            "every GPU of the node and gates no readiness on them (--gpu-scope node)"
        )
    return "node"


def _node_agent(options: Mapping[str, Any]) -> NodeAgentClient | None:
    """The node agent's client when ``--node-agent-url`` names one (its token is required)."""
    url = options["node_agent_url"]
    if not url:
        return None
    token = required_token(
        os.environ.get(AGENT_TOKEN_ENV),
        options["node_agent_token_file"],
        "--node-agent-token-file",
        what="node agent",
        missing=f"--node-agent-url needs the agent's token: ${AGENT_TOKEN_ENV} or "
        "--node-agent-token-file",
    )
    return NodeAgentClient(url, token, options["node"])


def _gpu_scope(
    value: str, socket: Path, pod: str, namespace: str, agent: NodeAgentClient | None
) -> GpuScope:
    try:
        return scope.resolve(
            value, pod=pod, namespace=namespace, environ=os.environ, socket=socket, agent=agent
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu-scope") from None


def _gpu_backend(spec: str, gpu_scope: GpuScope | None) -> GpuTelemetry:
    try:
        return gpu.open_backend(spec, scope=gpu_scope)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None


AGENT_TOKEN_ENV = "INFERWATCH_SIDECAR_NODE_AGENT_TOKEN"
#: an http(s) URL with no user-info (the token goes in a header, never in the URL)
AGENT_URL = r"https?://[^\s/@]+(/[^\s@]*)?"


def kubelet_socket_option(mount: str) -> Callable[[F], F]:
    """``--kubelet-socket``: the sidecar's (``--gpu-scope kubelet``) and the node agent's;
    ``mount`` says how the pod mounts the socket's directory."""
    return click.option(
        "--kubelet-socket",
        type=click.Path(dir_okay=False, path_type=Path),
        default=scope.KUBELET_SOCKET,
        show_envvar=True,
        show_default=True,
        help=f"The kubelet's PodResources socket (mount its directory {mount}).",
    )


def _agent_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value and not re.fullmatch(AGENT_URL, value):
        raise click.BadParameter(f"{value!r} is not an http(s) URL without user:password@")
    return value


REGISTRATION = Registration(
    "gpu",
    options=[
        click.option(
            "--gpu",
            default="auto",
            show_envvar=True,
            help="GPU telemetry: auto, nvml, dcgm=URL (a dcgm-exporter /metrics page), "
            "replay=DIR (a recorded NVML session) or none.",
        ),
        click.option(
            "--gpu-scope",
            default="auto",
            show_envvar=True,
            help="The GPUs this replica's engine uses, whose series are served and whose faults "
            "fail /readyz: agent (this pod's allocation, from the node agent on its node), "
            "kubelet (this pod's allocation, from the kubelet PodResources API), a "
            "device list (GPU-uuid, MIG-uuid, index or nvidiaN, comma-separated: the engine's "
            "CUDA_VISIBLE_DEVICES value works as it is), all (every GPU the sidecar sees), or "
            "node (every GPU, readiness never gated: node-wide reading, one sidecar per node). "
            "auto: in Kubernetes agent when --node-agent-url is set, else the device plugin's "
            "$NVIDIA_VISIBLE_DEVICES when it lists devices, else kubelet; elsewhere "
            "$CUDA_VISIBLE_DEVICES when set, else all; node without --engine-url.",
        ),
        click.option(
            "--node-agent-url",
            default="",
            callback=_agent_url,
            show_envvar=True,
            help="The node agent (inferwatch node-agent) on this pod's node, through a Service "
            "with internalTrafficPolicy: Local; its bearer token comes from "
            f"${AGENT_TOKEN_ENV} or --node-agent-token-file.",
        ),
        token_file_option(
            "--node-agent-token-file",
            "File holding the node agent's bearer token (a mounted Secret).",
        ),
        kubelet_socket_option("into the sidecar"),
    ],
    build=build,
)
