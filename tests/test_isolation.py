"""Replica isolation: the sidecar's admin endpoint, and the action that drives it, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

import support.runbooks_harness as h
from inferwatch.cli import main
from inferwatch.runbooks.actions.base import ActionError, Alert
from inferwatch.runbooks.actions.isolate_replica import IsolateReplica

pytestmark = pytest.mark.unit

AUTH = {"authorization": f"Bearer {h.SIDECAR_TOKEN}"}


@pytest.fixture
def sidecar(runbook_loop: h.Loop, page_server: Any) -> Iterator[h.SidecarUnderTest]:
    made = h.SidecarUnderTest(runbook_loop, page_server.url + h.VLLM_PAGE)
    yield made
    made.served.stop()


def isolated_gauge(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "inferwatch_replica_ready"
                and sample.labels["condition"] == "isolated"
            ):
                return sample.value
    raise AssertionError("no inferwatch_replica_ready{condition=isolated} series")


def test_admin_endpoint_refuses_missing_and_wrong_tokens(sidecar: h.SidecarUnderTest) -> None:
    url = sidecar.url + "/admin/isolation"
    body = {"reason": "r", "fingerprint": "ab"}
    assert httpx.post(url, json=body, timeout=10).status_code == 401
    wrong = {"authorization": "Bearer " + "x" * 30}
    assert httpx.post(url, json=body, headers=wrong, timeout=10).status_code == 401
    basic = {"authorization": f"Basic {h.SIDECAR_TOKEN}"}
    assert httpx.delete(url, headers=basic, timeout=10).status_code == 401
    assert sidecar.state()["isolated"] is False


def test_admin_endpoint_is_disabled_without_a_token(runbook_loop: h.Loop, page_server: Any) -> None:
    async def build() -> Any:
        from inferwatch.exporters.engine.collector import EngineCollector
        from inferwatch.exporters.sidecar import Sidecar
        from inferwatch.serving.page_fetch import EngineScraper

        scraper = EngineScraper(page_server.url + h.VLLM_PAGE, timeout_s=2.0, max_bytes=1 << 22)
        return Sidecar([EngineCollector(scraper, {"model": "m"})])

    served = h.Served(runbook_loop, runbook_loop.run(build).app())
    try:
        reply = httpx.post(served.url + "/admin/isolation", json={"reason": "r"}, timeout=10)
        assert reply.status_code == 403
    finally:
        served.stop()


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1]",
        b'{"reason": 5}',
        b'{"fingerprint": "ab"}',
        b'{"reason": "' + b"x" * 5000 + b'"}',
    ],
    ids=["not-json", "array", "reason-not-string", "no-reason", "oversized"],
)
def test_bad_admin_bodies_get_400_and_change_nothing(
    sidecar: h.SidecarUnderTest, body: bytes
) -> None:
    reply = httpx.post(sidecar.url + "/admin/isolation", content=body, headers=AUTH, timeout=10)
    assert reply.status_code == 400
    assert sidecar.state()["isolated"] is False


def test_isolation_fails_readyz_and_the_gauge_until_deleted(sidecar: h.SidecarUnderTest) -> None:
    assert sidecar.readyz().status_code == 200
    assert isolated_gauge(sidecar.url) == 1
    url = sidecar.url + "/admin/isolation"
    first = httpx.post(
        url, json={"reason": "xid 79", "fingerprint": "ab12"}, headers=AUTH, timeout=10
    )
    assert first.json()["changed"] is True
    again = httpx.post(
        url, json={"reason": "other", "fingerprint": "cd34"}, headers=AUTH, timeout=10
    )
    assert again.json()["changed"] is False and again.json()["fingerprint"] == "ab12"
    ready = sidecar.readyz()
    assert ready.status_code == 503
    condition = {c["name"]: c for c in ready.json()["conditions"]}["isolated"]
    assert condition == {"name": "isolated", "ok": False, "reason": "xid 79"}
    assert isolated_gauge(sidecar.url) == 0
    # a rollback for another alert leaves this isolation alone
    other = httpx.delete(url, params={"fingerprint": "cd34"}, headers=AUTH, timeout=10)
    assert other.status_code == 409 and sidecar.state()["isolated"] is True
    cleared = httpx.delete(url, params={"fingerprint": "ab12"}, headers=AUTH, timeout=10)
    assert cleared.json()["changed"] is True
    assert httpx.delete(url, headers=AUTH, timeout=10).json()["changed"] is False
    assert sidecar.readyz().status_code == 200
    assert isolated_gauge(sidecar.url) == 1


def _alert(**labels: str) -> Alert:
    return Alert(
        status="firing",
        labels={"alertname": "InferwatchGPUXidErrors", **labels},
        annotations={"summary": "XID"},
        starts_at="2026-11-30T00:25:23Z",
        ends_at="0001-01-01T00:00:00Z",
        fingerprint="ab12",
    )


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(h.SIDECAR_TOKEN + "\n")
    return path


def test_plan_fills_the_url_from_labels_and_is_pure(token_file: Path) -> None:
    action = IsolateReplica(token_file=str(token_file))
    (step,) = action.plan(_alert(instance="10.0.0.5:9400", model="llama"), {})
    assert step.target == "sidecar http://10.0.0.5:9400/admin/isolation"
    assert (step.unit, step.group) == ("replica", "llama")
    assert step.desired == {
        "isolated": True,
        "fingerprint": "ab12",
        "reason": "InferwatchGPUXidErrors: XID",
    }
    template = {"admin_url": "https://{instance}/admin/isolation"}
    (step,) = action.plan(_alert(instance="10.0.0.5:9400"), template)
    assert step.target == "sidecar https://10.0.0.5:9400/admin/isolation"
    assert step.group == "replicas"  # no model: the receiver sets the inventory's population


@pytest.mark.parametrize(
    ("labels", "params", "message"),
    [
        ({}, {}, "no 'instance' label"),
        ({"instance": "evil.com/x?y=", "model": "m"}, {}, "is not a host:port"),
        ({"instance": "a@b:1", "model": "m"}, {}, "is not a host:port"),
        (  # the token goes only to the inventory entry's instance, never to another host
            {"instance": "h:1", "pod": "p"},
            {"admin_url": "http://{pod}.sidecars:9400/x"},
            "is not the replica's instance",
        ),
        ({"instance": "h:1", "model": "m"}, {"group": "{job}"}, "unknown parameters"),
        ({"instance": "h:1", "model": "m"}, {"shell": "rm"}, "unknown parameters"),
        ({"instance": "h:1", "model": "m"}, {"admin_url": "file://{instance}/x"}, "not an http"),
    ],
)
def test_plan_refuses_labels_that_cannot_make_a_safe_url(
    token_file: Path, labels: dict[str, str], params: dict[str, str], message: str
) -> None:
    with pytest.raises(ActionError, match=message):
        IsolateReplica(token_file=str(token_file)).plan(_alert(**labels), params)


def test_apply_verify_revert_against_a_real_sidecar(
    runbook_loop: h.Loop, sidecar: h.SidecarUnderTest, token_file: Path
) -> None:
    async def scenario() -> list[Any]:
        action = IsolateReplica(token_file=str(token_file))
        (step,) = action.plan(_alert(instance=sidecar.address, model="llama"), {})
        try:
            return [
                await action.verify(step),
                await action.apply(step),
                await action.apply(step),
                await action.verify(step),
                await action.revert(step),
                await action.revert(step),
                await action.verify(step),
            ]
        finally:
            await action.aclose()

    before, first, second, verified, reverted, again, after = runbook_loop.run(scenario)
    assert not before.ok
    assert first.ok and first.changed
    assert second.ok and not second.changed
    assert verified.ok and verified.observed["readyz_status"] == 503
    assert reverted.ok and reverted.changed
    assert again.ok and not again.changed
    assert not after.ok and sidecar.readyz().status_code == 200


def test_apply_with_a_wrong_token_fails_and_changes_nothing(
    runbook_loop: h.Loop, sidecar: h.SidecarUnderTest, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("y" * 32)

    async def scenario() -> Any:
        action = IsolateReplica(token_file=str(wrong))
        try:
            (step,) = action.plan(_alert(instance=sidecar.address, model="llama"), {})
            return await action.apply(step)
        finally:
            await action.aclose()

    outcome = runbook_loop.run(scenario)
    assert not outcome.ok and "HTTP 401" in outcome.detail
    assert sidecar.state()["isolated"] is False


def test_sidecar_refuses_a_guessable_admin_token(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("secret\n")
    args = ["sidecar", "--engine-url", "http://127.0.0.1:9", "--admin-token-file", str(short)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "at least 16 characters" in result.output and "Traceback" not in result.output
