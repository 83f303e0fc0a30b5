"""A real Alertmanager delivers to the receiver: its webhook, its token, its fingerprints."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import support.runbooks_harness as h
from support.ports import running
from support.shared import tool

pytestmark = pytest.mark.e2e


def _now() -> str:
    moment = datetime.datetime.now(datetime.UTC)
    return moment.isoformat().replace("+00:00", "Z")


@pytest.fixture
def alertmanager(tmp_path: Path, receiver_url: str) -> Iterator[str]:
    token = tmp_path / "am-token"
    token.write_text(h.RECEIVER_TOKEN)
    config = tmp_path / "alertmanager.yml"
    config.write_text(
        f"""
route:
  receiver: runbooks
  group_by: [alertname, instance]
  group_wait: 100ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: runbooks
    webhook_configs:
      - url: {receiver_url}/webhook
        send_resolved: true
        http_config:
          authorization: {{type: Bearer, credentials_file: {token}}}
"""
    )
    with running(
        lambda port: [
            tool("prometheus-alertmanager"),
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        tmp_path / "alertmanager.log",
        "/-/ready",
        "Alertmanager",
    ) as url:
        yield url


@pytest.fixture
def stack(
    tmp_path: Path, page_server: Any
) -> Iterator[tuple[h.ReceiverUnderTest, h.SidecarUnderTest]]:
    loop = h.Loop()
    rules = h.config()["rules"]
    rules[0]["rollback_after"] = "0s"
    sidecar = h.SidecarUnderTest(loop, page_server.url + h.VLLM_PAGE)
    receiver = h.ReceiverUnderTest(loop, tmp_path, h.config(rules=rules), execute=True)
    yield receiver, sidecar
    receiver.stop()
    sidecar.served.stop()
    loop.close()


@pytest.fixture
def receiver_url(stack: tuple[h.ReceiverUnderTest, h.SidecarUnderTest]) -> str:
    return stack[0].url


def test_alertmanager_delivery_isolates_and_resolve_rolls_back(
    stack: tuple[h.ReceiverUnderTest, h.SidecarUnderTest], alertmanager: str
) -> None:
    receiver, sidecar = stack
    labels = {
        "alertname": "InferwatchGPUXidErrors",
        "severity": "critical",
        "instance": sidecar.address,
        "model": "llama",
        "xid": "79",
    }
    fired = {"labels": labels, "annotations": {"summary": "XID 79"}, "startsAt": _now()}
    assert httpx.post(alertmanager + "/api/v2/alerts", json=[fired], timeout=10).status_code == 200
    record = receiver.wait_for("applied", timeout=30)
    (known,) = httpx.get(alertmanager + "/api/v2/alerts", timeout=10).json()
    assert record["fingerprint"] == known["fingerprint"]
    assert record["am_receiver"] == "runbooks"
    state = sidecar.state()
    assert state["isolated"] and state["fingerprint"] == known["fingerprint"]
    assert sidecar.readyz().status_code == 503

    resolved = {**fired, "endsAt": _now()}
    assert (
        httpx.post(alertmanager + "/api/v2/alerts", json=[resolved], timeout=10).status_code == 200
    )
    receiver.wait_for("reverted", timeout=30)
    assert sidecar.state()["isolated"] is False
    assert receiver.outcomes().count("applied") == 1
