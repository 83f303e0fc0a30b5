"""The runbook receiver over real HTTP against real sidecars: auth, bad input, every guard."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import support.runbooks_harness as h
from inferwatch import auth
from inferwatch.cli import main
from inferwatch.runbooks import audit as audit_module
from support.proxy_stack import samples

pytestmark = pytest.mark.proc


@pytest.fixture
def receiver(runbook_loop: h.Loop, tmp_path: Path) -> Iterator[Callable[..., h.ReceiverUnderTest]]:
    made: list[h.ReceiverUnderTest] = []

    def make(execute: bool = True, queue_size: int = 100, **overrides: Any) -> h.ReceiverUnderTest:
        folder = tmp_path / f"receiver-{len(made)}"
        folder.mkdir()
        made.append(
            h.ReceiverUnderTest(runbook_loop, folder, h.config(**overrides), execute, queue_size)
        )
        return made[-1]

    yield make
    for item in made:
        item.stop()


def metric(url: str, name: str, **labels: str) -> float:
    return samples(httpx.get(url + "/metrics", timeout=10).text, name, **labels)


# ---- authentication ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [None, "Bearer wrong-token-0123456789", f"Basic {h.RECEIVER_TOKEN}", "Bearer", ""],
    ids=["missing", "wrong", "basic-scheme", "empty-bearer", "empty"],
)
def test_unauthenticated_webhooks_get_401_and_act_on_nothing(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
    header: str | None,
) -> None:
    rx, (sidecar,) = receiver(), sidecars(1)
    headers = {"authorization": header} if header is not None else {}
    body = h.payload(h.alert(sidecar.address))
    reply = httpx.post(rx.url + "/webhook", json=body, headers=headers, timeout=10)
    assert reply.status_code == 401
    rx.drain()
    assert sidecar.state()["isolated"] is False
    assert rx.audit() == []  # counted, not audited: a stranger cannot fill the audit volume
    assert metric(rx.url, "inferwatch_runbooks_webhooks_total", outcome="unauthorized") == 1


def test_the_token_is_compared_in_constant_time(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    rx, (sidecar,) = receiver(), sidecars(1)
    assert rx.post(h.payload(h.alert(sidecar.address)), token="Z" * 25).status_code == 401
    assert (b"Z" * 25, h.RECEIVER_TOKEN.encode()) in compared


# ---- hostile payloads --------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{not json",
        b"[]",
        b'{"version": "3", "alerts": []}',
        b'{"version": "4", "alerts": {}}',
        b'{"version": "4", "alerts": [{"status": "firing"}]}',
        b'{"version": "4", "alerts": [{"status": "burning", "labels": {"alertname": "A"}}]}',
    ],
    ids=[
        "empty",
        "broken-json",
        "array",
        "version-3",
        "alerts-not-list",
        "no-labels",
        "bad-status",
    ],
)
def test_malformed_payloads_get_400_and_act_on_nothing(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
    body: bytes,
) -> None:
    rx, (sidecar,) = receiver(), sidecars(1)
    assert rx.post(body).status_code == 400
    rx.drain()
    assert sidecar.state()["isolated"] is False
    assert rx.outcomes() == ["malformed"]


@pytest.mark.parametrize(
    "spoil",
    [
        {"fingerprint": "not hex!"},
        {"startsAt": "2026-02-30T00:25:23Z"},  # matches the pattern, no such day
        {"labels": {"alertname": "InferwatchGPUXidErrors", "instance": 7}},
    ],
    ids=["fingerprint", "impossible-date", "label-not-a-string"],
)
def test_one_bad_alert_costs_only_itself(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
    spoil: dict[str, Any],
) -> None:
    rx, (first, second) = receiver(), sidecars(2)
    bad = {**h.alert(first.address, fingerprint="ab"), **spoil}
    body = h.payload(h.alert(first.address), bad, h.alert(second.address, fingerprint="cd"))
    assert rx.post(body).status_code == 200
    rx.drain()
    assert rx.outcomes() == ["applied", "malformed", "applied"]
    assert first.state()["isolated"] and second.state()["isolated"]


def test_oversized_payloads_get_413_declared_or_streamed(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
) -> None:
    rx, (sidecar,) = receiver(), sidecars(1)
    big = h.payload(h.alert(sidecar.address, padding="x" * 4000))
    big["alerts"] *= 20  # > the 64 KiB limit of the harness, every alert valid
    assert rx.post(big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: bounded while read
        yield b'{"version": "4", "alerts": ['
        for _ in range(200):
            yield b"[" + b" " * 1000 + b"],"
        yield b"[]]}"

    assert rx.post(chunks()).status_code == 413
    rx.drain()
    assert sidecar.state()["isolated"] is False
    assert rx.outcomes() == ["too_large", "too_large"]


# ---- decisions -----------------------------------------------------------------------------


def test_dry_run_records_the_plan_and_changes_nothing(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
) -> None:
    rx, (sidecar,) = receiver(execute=False), sidecars(1)
    assert rx.post(h.payload(h.alert(sidecar.address))).status_code == 200
    rx.drain()
    (record,) = rx.audit()
    assert record["decision"] == "dry_run" and record["execute"] is False
    (step,) = record["steps"]
    assert step["target"] == f"sidecar http://{sidecar.address}/admin/isolation"
    assert step["desired"]["isolated"] is True
    assert sidecar.state()["isolated"] is False and sidecar.readyz().status_code == 200
    assert metric(rx.url, "inferwatch_runbooks_execute") == 0


def test_acting_isolates_verifies_and_is_measured(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
    promtool: str,
) -> None:
    rx, (sidecar,) = receiver(), sidecars(1)
    assert rx.post(h.payload(h.alert(sidecar.address))).json() == {"accepted": 1}
    rx.drain()
    (record,) = rx.audit()
    assert record["decision"] == "acted" and record["outcome"] == "applied"
    assert record["verification"][0]["ok"] is True
    assert record["payload_sha256"] and record["fingerprint"] == "7f35b58fac4dbac1"
    state = sidecar.state()
    assert state["isolated"] and state["fingerprint"] == "7f35b58fac4dbac1"
    assert sidecar.readyz().status_code == 503
    labels = {"action": "isolate_replica"}
    assert metric(rx.url, "inferwatch_runbooks_actions_total", outcome="applied", **labels) == 1
    assert metric(rx.url, "inferwatch_runbooks_alert_to_action_seconds_count", **labels) == 1
    text = httpx.get(rx.url + "/metrics", timeout=10).text
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert checked.returncode == 0, checked.stderr


def test_redelivery_and_an_ha_pair_act_once(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
) -> None:
    first, second = receiver(), receiver()
    (sidecar,) = sidecars(1)
    body = h.payload(h.alert(sidecar.address))
    for _ in range(3):
        assert first.post(body).status_code == 200
    first.drain()
    since = sidecar.state()["since"]
    assert second.post(body).status_code == 200
    second.drain()
    assert first.outcomes() == ["applied", "duplicate", "duplicate"]
    assert second.outcomes() == ["no_op"]  # the state lives in the sidecar
    assert sidecar.state()["since"] == since


def test_cooldown_refuses_a_refire_on_the_same_target(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
) -> None:
    rules = h.config()["rules"]
    rules[0].update(cooldown="30m", rollback_after="0s")
    rx, (sidecar,) = receiver(rules=rules), sidecars(1)
    assert rx.post(h.payload(h.alert(sidecar.address))).status_code == 200
    rx.drain()
    assert rx.post(h.payload(h.alert(sidecar.address, status="resolved"))).status_code == 200
    rx.wait_for("reverted")
    assert sidecar.state()["isolated"] is False
    refire = h.alert(sidecar.address, starts_at="2026-11-30T01:00:00Z")  # a new episode
    assert rx.post(h.payload(refire)).status_code == 200
    rx.drain()
    assert rx.outcomes()[-1] == "cooldown"
    assert sidecar.state()["isolated"] is False


def test_breaker_opens_at_the_fraction_and_stays_open_until_reset(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
    tmp_path: Path,
) -> None:
    breaker = {"max_fraction": 0.34, "window": "1h"}
    rx, replicas = receiver(breaker=breaker), sidecars(3)
    alerts = [h.alert(s.address, fingerprint=f"{i + 1:016x}") for i, s in enumerate(replicas)]
    for one in alerts:
        assert rx.post(h.payload(one)).status_code == 200
    rx.drain()
    assert rx.outcomes() == ["applied", "breaker", "breaker"]
    reasons = [r["reason"] for r in rx.audit()[1:]]
    assert reasons[0].startswith("breaker tripped: 2 of 3 in replica llama")
    assert reasons[1] == "breaker open for replica llama"
    assert [s.state()["isolated"] for s in replicas] == [True, False, False]
    group = {"unit": "replica", "group": "llama"}
    assert metric(rx.url, "inferwatch_runbooks_breaker_open", **group) == 1

    token_file = tmp_path / "receiver-token"
    token_file.write_text(h.RECEIVER_TOKEN)
    wrong = httpx.post(rx.url + "/admin/breaker/reset", timeout=10)
    assert wrong.status_code == 401
    rx.post(h.payload(alerts[1]))  # still open: nobody reset it
    rx.drain()
    assert rx.outcomes()[-1] == "breaker"

    reset = ["runbooks", "reset-breaker", "--url", rx.url, "--token-file", str(token_file)]
    result = CliRunner().invoke(main, reset)
    assert result.exit_code == 0, result.output
    assert result.output == "closed 1 breaker(s): replica/llama\n"
    assert metric(rx.url, "inferwatch_runbooks_breaker_open", **group) == 0
    again = CliRunner().invoke(main, reset)  # nothing open: a whole sentence, no empty list
    assert (again.exit_code, again.output) == (0, "closed 0 breakers (none was open)\n")
    rx.post(h.payload(alerts[1]))
    rx.drain()
    assert rx.outcomes()[-1] == "applied"
    assert [r["decision"] for r in rx.audit()][-2] == "breaker_reset"
    assert replicas[1].state()["isolated"] is True


def test_namespace_allow_list(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
) -> None:
    """The namespace is the inventory's: an alert that drops its namespace label, or names
    another, is judged by the namespace its target is in."""
    rx, (allowed, other, bare) = receiver(namespaces=["inference"]), sidecars(3)
    allowed.listed["namespace"] = "inference"
    other.listed["namespace"] = "kube-system"
    rx.post(h.payload(h.alert(allowed.address, fingerprint="a1")))  # no namespace label
    rx.post(h.payload(h.alert(other.address, fingerprint="a2", namespace="inference")))
    rx.post(h.payload(h.alert(bare.address, fingerprint="a3", namespace="inference")))
    rx.drain()
    assert rx.outcomes() == ["applied", "inventory", "namespace"]
    assert [s.state()["isolated"] for s in (allowed, other, bare)] == [True, False, False]


def test_unmapped_alerts_are_recorded_as_skipped(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
) -> None:
    rx, (sidecar,) = receiver(), sidecars(1)
    warning = h.alert(sidecar.address, severity="warning")  # the rule wants critical
    other = h.alert(sidecar.address, alertname="InferwatchTTFTHigh")
    rx.post(h.payload(warning, other))
    rx.drain()
    assert [(r["decision"], r["reason"]) for r in rx.audit()] == [("skipped", "unmapped")] * 2
    assert metric(rx.url, "inferwatch_runbooks_unmapped_alerts_total") == 2
    assert sidecar.state()["isolated"] is False


def test_every_decision_is_fsynced(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    synced: list[int] = []
    real = audit_module.os.fsync

    def spy(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(audit_module.os, "fsync", spy)
    rx, (sidecar,) = receiver(), sidecars(1)
    rx.post(h.payload(h.alert(sidecar.address), h.alert(sidecar.address, alertname="Other")))
    rx.post(b"junk")
    rx.drain()
    assert len(rx.audit()) == 3 and len(synced) == 3


def test_a_failed_verification_is_recorded(
    runbook_loop: h.Loop, receiver: Callable[..., h.ReceiverUnderTest]
) -> None:
    """A sidecar that accepts the isolation but whose /readyz still passes (a broken one)."""

    async def admin(request: Request) -> JSONResponse:
        return JSONResponse({"isolated": True, "changed": True, "fingerprint": "7f35b58fac4dbac1"})

    async def readyz(request: Request) -> JSONResponse:
        return JSONResponse({"ready": True, "conditions": [{"name": "engine", "ok": True}]})

    app = Starlette(
        routes=[Route("/admin/isolation", admin, methods=["POST"]), Route("/readyz", readyz)]
    )
    liar = h.Served(runbook_loop, app)
    h.listing(runbook_loop, liar.address)
    try:
        rx = receiver()
        rx.post(h.payload(h.alert(liar.address)))
        rx.drain()
        (record,) = rx.audit()
        assert (record["decision"], record["outcome"]) == ("failed", "verification_failed")
        assert record["verification"][0]["ok"] is False
    finally:
        liar.stop()


def test_an_unreachable_sidecar_fails_and_a_redelivery_retries(
    runbook_loop: h.Loop,
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
    unused_port: int,
) -> None:
    rx = receiver()
    h.listing(runbook_loop, f"127.0.0.1:{unused_port}")
    rx.post(h.payload(h.alert(f"127.0.0.1:{unused_port}")))
    rx.drain()
    assert rx.outcomes() == ["failed"] and "ConnectError" in rx.audit()[0]["reason"]
    rx.post(h.payload(h.alert(f"127.0.0.1:{unused_port}")))
    rx.drain()
    assert rx.outcomes() == ["failed", "failed"]  # not marked seen: retried, not "duplicate"


def test_rollback_after_the_hold_unless_it_fires_again(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
) -> None:
    rules = h.config()["rules"]
    quick = {**rules[0], "name": "quick", "rollback_after": "200ms", "matchers": ['pod="a"']}
    slow = {**rules[0], "name": "slow", "rollback_after": "1h", "matchers": ['pod="b"']}
    rx, (a, b) = receiver(rules=[quick, slow]), sidecars(2)
    fire_a, fire_b = (
        h.alert(a.address, fingerprint="aa", pod="a"),
        h.alert(b.address, fingerprint="bb", pod="b"),
    )
    rx.post(h.payload(fire_a, fire_b))
    rx.drain()
    assert a.state()["isolated"] and b.state()["isolated"]
    resolved = [{**x, "status": "resolved"} for x in (fire_a, fire_b)]
    rx.post(h.payload(*resolved))
    rx.post(h.payload(*resolved))  # redelivered: scheduled once
    rx.wait_for("reverted")
    assert a.state()["isolated"] is False
    assert b.state()["isolated"] is True  # its hold has not ended
    rx.post(h.payload(fire_b))  # fires again: the pending rollback is dropped
    rx.drain()
    outcomes = rx.outcomes()
    assert outcomes.count("rollback_scheduled") == 2
    assert outcomes[-2:] == ["rollback_cancelled", "duplicate"]
    assert b.state()["isolated"] is True


def test_a_resolve_redelivered_after_the_rollback_does_not_roll_back_again(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
) -> None:
    rule = {**h.config()["rules"][0], "rollback_after": "100ms"}
    rx, (a,) = receiver(rules=[rule]), sidecars(1)
    firing = h.alert(a.address, fingerprint="aa")
    rx.post(h.payload(firing))
    rx.drain()
    resolved = {**firing, "status": "resolved"}
    rx.post(h.payload(resolved))
    rx.wait_for("reverted")
    rx.post(h.payload(resolved))  # Alertmanager's retry, after the hold ended
    rx.drain()
    outcomes = rx.outcomes()
    assert outcomes.count("rollback_scheduled") == 1, outcomes
    assert outcomes.count("reverted") == 1, outcomes


def test_a_full_queue_answers_503_so_alertmanager_retries(
    runbook_loop: h.Loop, receiver: Callable[..., h.ReceiverUnderTest]
) -> None:
    """The worker is held by a target that does not answer yet; the queue holds one more."""
    with h.held_target(runbook_loop) as (slow, arrived):
        rx = receiver(queue_size=1)
        assert rx.post(h.payload(h.alert(slow, fingerprint="a1"))).status_code == 200
        assert arrived.wait(10), "the worker never reached the target"
        assert rx.post(h.payload(h.alert(slow, fingerprint="a2"))).status_code == 200
        busy = rx.post(h.payload(h.alert(slow, fingerprint="a3")))
        assert busy.status_code == 503
        assert metric(rx.url, "inferwatch_runbooks_webhooks_total", outcome="busy") == 1


def test_alerts_cut_off_by_alertmanager_are_recorded(
    receiver: Callable[..., h.ReceiverUnderTest],
    sidecars: Callable[[int], list[h.SidecarUnderTest]],
) -> None:
    rx, (sidecar,) = receiver(), sidecars(1)
    rx.post({**h.payload(h.alert(sidecar.address)), "truncatedAlerts": 7})
    rx.drain()
    truncated, acted = rx.audit()
    assert (truncated["outcome"], truncated["reason"]) == (
        "truncated",
        "7 alerts cut off by max_alerts",
    )
    assert acted["outcome"] == "applied"
