"""HA Alertmanager meets receiver idempotency: two clustered Alertmanagers, two receivers, one
action.

Everything is a real process on loopback: two ``prometheus-alertmanager`` instances gossiping
as one cluster (``--cluster.*``), two ``inferwatch runbooks serve --execute`` receivers, and
one ``inferwatch sidecar`` whose isolation flag is the action's target. Both Alertmanagers
route the alert to both receivers and re-send it every ``repeat_interval``, the at-least-once
delivery an HA setup gives. The receivers share nothing: each has its own seen-set and audit
log. The state lives in the target, so whichever receiver reaches the sidecar second finds
it already isolated (a no-op), and each receiver's own re-deliveries are duplicates.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from support.ports import announced_url, launch, pick_port
from support.wait import wait_for

pytestmark = pytest.mark.e2e

INFERWATCH = Path(sys.executable).parent / "inferwatch"
FIXTURE = "vllm-generated-0.33.0-1engine"
RECEIVER_TOKEN = "receiver-token-0123456789"
SIDECAR_TOKEN = "sidecar-admin-token-0123456789"
DEADLINE_S = 60.0
#: what a wait reads as 'not yet': a server still starting, a reply not yet complete
WAITING = (httpx.HTTPError, ValueError, KeyError)


@contextlib.contextmanager
def stopped(process: subprocess.Popen[bytes], log: Path) -> Iterator[None]:
    """Stop ``process`` after the block; it must exit cleanly and log no traceback."""
    try:
        yield
    finally:
        process.terminate()
        try:
            status = process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            status = process.wait()
        assert status in (0, -signal.SIGTERM), log.read_text()
        assert "Traceback" not in log.read_text(), log.read_text()


@contextlib.contextmanager
def ours(args: list[str], ready_path: str, log: Path) -> Iterator[str]:
    """One of our servers, listening on a port the OS gave it (``--listen=127.0.0.1:0``);
    its URL once ``ready_path`` answers 200."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*args, "--listen=127.0.0.1:0"], stdout=out, stderr=subprocess.STDOUT
        )
    with stopped(process, log):
        url = announced_url(process, log, log.stem)
        wait_for(
            lambda: httpx.get(url + ready_path, timeout=2).status_code == 200,
            url + ready_path,
            DEADLINE_S,
            ignore=WAITING,
        )
        yield url


@contextlib.contextmanager
def alertmanager(
    binary: str, config: Path, storage: Path, log: Path, peers: list[str]
) -> Iterator[tuple[str, str]]:
    """An Alertmanager joining the cluster of ``peers`` (gossip addresses); (its URL, its own
    gossip address). Its web and gossip ports are picked together and picked again when
    either was taken before it bound them."""
    gossip = ""

    def argv(web: int) -> list[str]:
        nonlocal gossip
        gossip = f"127.0.0.1:{pick_port()}"
        return peer_args(binary, config, storage, web, gossip, peers)

    process, url = launch(argv, log, "/-/ready", "Alertmanager", DEADLINE_S)
    with stopped(process, log):
        yield url, gossip


class Receiver:
    """One ``inferwatch runbooks serve --execute`` process's URL and audit log."""

    def __init__(self, name: str, url: str, audit_path: Path) -> None:
        self.name, self.url, self.audit_path = name, url, audit_path

    def decisions(self, fingerprint: str) -> list[dict[str, Any]]:
        if not self.audit_path.exists():
            return []
        records = []
        for line in self.audit_path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):  # the line being written right now
                records.append(json.loads(line))
        return [r for r in records if r.get("fingerprint") == fingerprint and "outcome" in r]


def mapping_config(tmp: Path, sidecar: str) -> Path:
    """One rule: a critical XID isolates the replica named by the alert's instance, which the
    inventory lists (the one ``sidecar``)."""
    token = tmp / "sidecar-token"
    token.write_text(SIDECAR_TOKEN + "\n")
    path = tmp / "actions.yaml"
    path.write_text(yaml.safe_dump({
        "execute": True,
        "namespaces": ["*"],
        "breaker": {"max_fraction": 1.0, "window": "1h"},
        "inventory": {"replicas": {"static": [
            {"instance": sidecar.removeprefix("http://"), "model": "llama"}]}},
        "actions": {"isolate_replica": {"token_file": str(token), "timeout": 5.0}},
        "rules": [{
            "name": "isolate-on-xid",
            "alertname": "InferwatchGPUXidErrors",
            "matchers": ['severity="critical"'],
            "action": "isolate_replica",
            "params": {"admin_url": "http://{instance}/admin/isolation"},
        }],
    }))  # fmt: skip
    return path


def alertmanager_config(tmp: Path, receivers: list[Receiver]) -> Path:
    """The same config on both peers: every receiver replica gets every notification, and a
    firing alert is re-sent every 2 s (so each receiver sees its own duplicates)."""
    token = tmp / "am-token"
    token.write_text(RECEIVER_TOKEN)
    path = tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump({
        "route": {
            "receiver": "runbooks",
            "group_by": ["alertname", "instance"],
            "group_wait": "100ms",
            "group_interval": "1s",
            "repeat_interval": "2s",
        },
        "receivers": [{
            "name": "runbooks",
            "webhook_configs": [
                {
                    "url": f"{r.url}/webhook",
                    "send_resolved": True,
                    "http_config": {
                        "authorization": {"type": "Bearer", "credentials_file": str(token)}
                    },
                }
                for r in receivers
            ],
        }],
    }))  # fmt: skip
    return path


def peer_args(
    binary: str, config: Path, storage: Path, port: int, gossip: str, peers: list[str]
) -> list[str]:
    return [
        binary, f"--config.file={config}", f"--storage.path={storage}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--cluster.listen-address={gossip}", f"--cluster.advertise-address={gossip}",
        *[f"--cluster.peer={peer}" for peer in peers],
        # gossip fast so the pair settles within a test; a peer waits this long for the
        # other's notification log before it sends
        "--cluster.gossip-interval=50ms", "--cluster.pushpull-interval=1s",
        "--cluster.peer-timeout=1s", "--log.level=warn",
    ]  # fmt: skip


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def test_two_alertmanagers_and_two_receivers_isolate_a_replica_once(
    tmp_path: Path, page_server: Any, alertmanager_bin: str
) -> None:
    token = tmp_path / "receiver-token"
    token.write_text(RECEIVER_TOKEN + "\n")
    engine = f"{page_server.url}/fixture/{FIXTURE}/metrics"
    (tmp_path / "sidecar-admin-token").write_text(SIDECAR_TOKEN + "\n")
    with contextlib.ExitStack() as stack:
        sidecar = stack.enter_context(ours(
            [str(INFERWATCH), "sidecar", f"--engine-url={engine}", "--gpu=none",
             f"--admin-token-file={tmp_path / 'sidecar-admin-token'}"],
            "/healthz", tmp_path / "sidecar.log",
        ))  # fmt: skip
        config = mapping_config(tmp_path, sidecar)
        receivers = []
        for name in ("receiver-a", "receiver-b"):
            audit = tmp_path / f"{name}-audit.jsonl"
            url = stack.enter_context(ours(
                [str(INFERWATCH), "runbooks", "serve", f"--config={config}", "--execute",
                 f"--token-file={token}", f"--audit-log={audit}"],
                "/healthz", tmp_path / f"{name}.log",
            ))  # fmt: skip
            receivers.append(Receiver(name, url, audit))
        am_config = alertmanager_config(tmp_path, receivers)
        ams, gossip = [], []
        for i in (0, 1):  # the second joins the first
            am, address = stack.enter_context(alertmanager(
                alertmanager_bin, am_config, tmp_path / f"am{i}",
                tmp_path / f"alertmanager-{i}.log", list(gossip),
            ))  # fmt: skip
            ams.append(am)
            gossip.append(address)

        def clustered() -> bool:
            states = [httpx.get(f"{am}/api/v2/status", timeout=5).json()["cluster"] for am in ams]
            return all(s["status"] == "ready" and len(s["peers"]) == 2 for s in states)

        wait_for(
            clustered,
            "the two Alertmanagers to form one settled cluster",
            DEADLINE_S,
            ignore=WAITING,
        )
        assert httpx.get(f"{sidecar}/readyz", timeout=5).status_code == 200

        alert = {
            "labels": {
                "alertname": "InferwatchGPUXidErrors", "severity": "critical",
                "instance": sidecar.removeprefix("http://"), "model": "llama", "xid": "79",
            },
            "annotations": {"summary": "XID 79"},
            "startsAt": now(),
        }  # fmt: skip
        for am in ams:  # what Prometheus does: every alert to every Alertmanager
            assert httpx.post(f"{am}/api/v2/alerts", json=[alert], timeout=10).status_code == 200
        fingerprints = {httpx.get(f"{am}/api/v2/alerts", timeout=10).json()[0]["fingerprint"]
                        for am in ams}  # fmt: skip
        (fingerprint,) = fingerprints

        def settled() -> bool:
            # each receiver acted (or found the target done) and then saw a re-delivery
            return all(
                {"duplicate"} <= {d["outcome"] for d in r.decisions(fingerprint)}
                and {"applied", "no_op"} & {d["outcome"] for d in r.decisions(fingerprint)}
                for r in receivers
            )

        wait_for(
            settled,
            "both receivers to act and then see a duplicate",
            DEADLINE_S,
            ignore=WAITING,
        )
        decisions = {r.name: r.decisions(fingerprint) for r in receivers}
        outcomes = [d["outcome"] for ds in decisions.values() for d in ds]
        assert outcomes.count("applied") == 1, decisions
        assert outcomes.count("no_op") == 1, decisions
        assert set(outcomes) == {"applied", "no_op", "duplicate"}, decisions
        changed = [
            result["changed"]
            for ds in decisions.values()
            for d in ds
            for result in d.get("results", [])
        ]
        assert changed.count(True) == 1 and changed.count(False) == 1, decisions
        (no_op,) = [d for ds in decisions.values() for d in ds if d["outcome"] == "no_op"]
        assert no_op["verification"][0]["ok"] is True  # it read the isolation back

        state = httpx.get(
            f"{sidecar}/admin/isolation",
            headers={"authorization": f"Bearer {SIDECAR_TOKEN}"},
            timeout=5,
        ).json()
        assert state["isolated"] is True and state["fingerprint"] == fingerprint
        assert httpx.get(f"{sidecar}/readyz", timeout=5).status_code == 503
        applied = [receiver_applied(r.url) for r in receivers]
        assert sorted(applied) == [0, 1]


def receiver_applied(url: str) -> int:
    """The receiver's own count of applied actions, from its /metrics."""
    page = httpx.get(f"{url}/metrics", timeout=5).text
    total = 0.0
    for line in page.splitlines():
        if line.startswith("inferwatch_runbooks_actions_total{") and 'outcome="applied"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
