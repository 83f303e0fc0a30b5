"""A replica's sidecar learns its GPUs from the node agent on its node, never from a hostPath.

The agent (``inferwatch node-agent``) is served in-process with a stand-in kubelet; the
sidecar's client reaches it through an httpx transport that hands each request to the app.
Every answer the client cannot trust (no token, another node, too large, malformed, late)
keeps the scope unknown, so GPU readiness fails closed as it does with the kubelet.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from inferwatch.cli import main
from inferwatch.exitcodes import ExitCode
from inferwatch.exporters.gpu.node_agent import MAX_BODY_BYTES, NodeAgentClient
from inferwatch.exporters.gpu.podresources import Allocation, PodResourcesError
from inferwatch.exporters.gpu.scope import FixedScope, KubeletScope, ScopeUnknown, resolve
from inferwatch.nodeagent import agent as node_agent

pytestmark = pytest.mark.unit

TOKEN = "node-agent-token-0123456789"
GPU_A = "GPU-9f1c2e4a-0000-4000-8000-00000000000a"
GPU_B = "GPU-9f1c2e4a-0000-4000-8000-00000000000b"
URL = "http://inferwatch-node-agent.inferwatch-system.svc:9406"


class Kubelet:
    """The kubelet's PodResources answers for a node with two GPU pods."""

    def __init__(self) -> None:
        self.pods = {("serving", "llama-0"): (GPU_A,), ("serving", "llama-1"): (GPU_B,)}
        self.calls = 0

    def allocation(self, pod: str, namespace: str) -> Allocation:
        self.calls += 1
        if (namespace, pod) not in self.pods:
            raise PodResourcesError("pod_not_found", f"kubelet lists no pod {namespace}/{pod}")
        return Allocation(pod, namespace, self.pods[(namespace, pod)])


def through(app: object) -> httpx.MockTransport:
    """A transport that hands every request to the ASGI ``app``."""
    client = TestClient(app)  # type: ignore[arg-type]

    def handle(request: httpx.Request) -> httpx.Response:
        answer = client.request(request.method, request.url.path, headers=request.headers)
        return httpx.Response(answer.status_code, content=answer.content)

    return httpx.MockTransport(handle)


@pytest.fixture
def kubelet() -> Kubelet:
    return Kubelet()


@pytest.fixture
def agent(kubelet: Kubelet) -> httpx.MockTransport:
    return through(node_agent.app(kubelet, TOKEN, "gpu-node-1"))


def client(
    transport: httpx.BaseTransport, token: str = TOKEN, node: str = "gpu-node-1"
) -> NodeAgentClient:
    return NodeAgentClient(URL, token, node, transport=transport)


def test_the_agent_answers_the_pods_own_gpus(agent: httpx.MockTransport) -> None:
    assert client(agent).allocation("llama-0", "serving").device_ids == (GPU_A,)
    assert client(agent).allocation("llama-1", "serving").device_ids == (GPU_B,)


def reason(call: Callable[[], object]) -> str:
    with pytest.raises(PodResourcesError) as failure:
        call()
    assert "\n" not in failure.value.detail
    return failure.value.reason


def test_no_token_no_answer(agent: httpx.MockTransport, kubelet: Kubelet) -> None:
    wrong = client(agent, token="someone-elses-token-000")
    assert reason(lambda: wrong.allocation("llama-0", "serving")) == "unauthorized"
    assert kubelet.calls == 0, "the kubelet was asked for an unauthenticated caller"


def test_an_answer_from_another_node_is_refused(agent: httpx.MockTransport) -> None:
    elsewhere = client(agent, node="gpu-node-2")
    assert reason(lambda: elsewhere.allocation("llama-0", "serving")) == "wrong_node"


def test_the_kubelets_reason_reaches_the_sidecar(agent: httpx.MockTransport) -> None:
    assert reason(lambda: client(agent).allocation("gone-0", "serving")) == "pod_not_found"


def test_a_name_kubernetes_would_refuse_is_not_asked(agent: httpx.MockTransport) -> None:
    assert reason(lambda: client(agent).allocation("../../metrics", "serving")) == "bad_pod"


def answering(body: bytes, status: int = 200) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, content=body))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"not json", "bad_answer"),
        (b"[]", "bad_answer"),
        (
            json.dumps(
                {"node": "gpu-node-1", "namespace": "serving", "pod": "other", "device_ids": []}
            ).encode(),
            "bad_answer",
        ),
        (
            json.dumps(
                {"node": "gpu-node-1", "namespace": "serving", "pod": "llama-0",
                 "device_ids": ["x" * 500]}
            ).encode(),
            "bad_answer",
        ),
        (b" " * (MAX_BODY_BYTES + 1), "too_large"),
    ],
    ids=["not-json", "not-an-object", "another-pod", "long-id", "oversized"],
)  # fmt: skip
def test_an_answer_the_client_cannot_trust_is_a_reason(body: bytes, expected: str) -> None:
    assert reason(lambda: client(answering(body)).allocation("llama-0", "serving")) == expected


def test_a_late_agent_is_a_timeout() -> None:
    def late(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    late_client = client(httpx.MockTransport(late))
    assert reason(lambda: late_client.allocation("llama-0", "serving")) == "timeout"


def test_the_scope_fails_closed_until_the_agent_answers(kubelet: Kubelet) -> None:
    kubelet.pods.pop(("serving", "llama-0"))
    agent = through(node_agent.app(kubelet, TOKEN, "gpu-node-1"))
    scope = KubeletScope(client(agent), "llama-0", "serving", retry_s=0.01, source="agent")
    scope.start()
    try:
        with pytest.raises(ScopeUnknown):
            scope.selection()
        kubelet.pods[("serving", "llama-0")] = (GPU_A,)
        assert scope.wait(10), "the scope never resolved once the agent answered"
        assert scope.selection().uuids == (GPU_A,)
        assert "node agent" in str(scope)
    finally:
        scope.close()


K8S = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


def test_auto_prefers_the_agent_then_the_device_plugin(agent: httpx.MockTransport) -> None:
    via_agent = resolve("auto", pod="llama-0", namespace="serving", environ=K8S,
                        agent=client(agent))  # fmt: skip
    try:
        assert isinstance(via_agent, KubeletScope) and via_agent.source == "agent"
    finally:
        via_agent.close()
    plugin = resolve(
        "auto", pod="llama-0", namespace="serving",
        environ={**K8S, "NVIDIA_VISIBLE_DEVICES": f"{GPU_A},{GPU_B}"},
    )  # fmt: skip
    assert isinstance(plugin, FixedScope) and plugin.source == "device_plugin"
    assert plugin.selection().uuids == (GPU_A, GPU_B)
    with pytest.raises(ValueError, match="--node-agent-url"):
        resolve("agent", pod="llama-0", namespace="serving", environ=K8S)


def test_readyz_fails_without_the_kubelet_socket(kubelet: Kubelet, tmp_path: Path) -> None:
    served = TestClient(node_agent.app(kubelet, TOKEN, "gpu-node-1", tmp_path / "kubelet.sock"))
    answer = served.get("/readyz")
    assert answer.status_code == 503 and "kubelet.sock" in answer.text
    assert served.get("/healthz").status_code == 200


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(node_agent.TOKEN_ENV, raising=False)
    monkeypatch.delenv("INFERWATCH_SIDECAR_NODE_AGENT_TOKEN", raising=False)
    yield


@pytest.mark.usefixtures("no_token")
def test_the_agent_refuses_to_start_without_a_token() -> None:
    result = CliRunner().invoke(main, ["node-agent", "--node", "gpu-node-1"])
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert "needs a token" in result.output and "Traceback" not in result.output


@pytest.mark.usefixtures("no_token")
def test_a_sidecar_given_an_agent_without_its_token_says_so() -> None:
    result = CliRunner().invoke(
        main,
        ["sidecar", "--listen=127.0.0.1:0", "--engine-url=http://127.0.0.1:1", "--gpu=nvml",
         f"--node-agent-url={URL}"],
    )  # fmt: skip
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert "INFERWATCH_SIDECAR_NODE_AGENT_TOKEN" in result.output


def test_lookups_are_counted_by_outcome(kubelet: Kubelet) -> None:
    app = node_agent.app(kubelet, TOKEN, "gpu-node-1")
    agent = through(app)
    client(agent).allocation("llama-0", "serving")
    with pytest.raises(PodResourcesError):
        client(agent).allocation("gone-0", "serving")
    with pytest.raises(PodResourcesError):
        client(agent, token="someone-elses-token-000").allocation("llama-0", "serving")
    page = TestClient(app).get("/metrics").text
    for outcome in ("ok", "pod_not_found", "unauthorized"):
        assert f'inferwatch_node_agent_lookups_total{{outcome="{outcome}"}} 1.0' in page, page
