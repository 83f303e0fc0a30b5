"""Restarts during an episode: of the receiver, of a sidecar, of both in every order.

Whatever restarts when, the episode ends as it would with no restart: its targets out while
it fires (a restarted sidecar's isolation is re-asserted), and back once its rollback ran (a
restarted receiver resumes the pending rollback from its state directory). Both are audited.
The receiver is the production dispatcher on a state directory; the sidecars are a fake that
keeps the real one's semantics (one fingerprint per isolation, a delete for another's is 409,
a restart forgets the flag).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.runbooks import config as mapping
from inferwatch.runbooks.actions.base import Alert, Outcome, Step
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.dispatch import Dispatcher
from inferwatch.runbooks.inventory import Inventory, Static
from inferwatch.runbooks.state import DirectoryStore

pytestmark = pytest.mark.unit

STARTS = "2026-12-01T09:00:00Z"
TARGETS = ("10.0.0.1:9400", "10.0.0.2:9400", "10.0.0.3:9400", "10.0.0.4:9400")


class FakeSidecars:
    """Every sidecar's isolation flag, as ``/admin/isolation`` keeps it."""

    name: ClassVar[str] = "isolate_replica"

    def __init__(self) -> None:
        self.isolated: dict[str, str] = {}  # instance -> fingerprint

    def plan(self, alert: Alert, params: Mapping[str, Any]) -> Sequence[Step]:
        instance = alert.labels["instance"]
        desired = {"isolated": True, "fingerprint": alert.fingerprint, "reason": "test"}
        return [Step(self.name, f"sidecar {instance}", "replica", "llama", desired, "test")]

    async def apply(self, step: Step) -> Outcome:
        instance = step.target.removeprefix("sidecar ")
        if instance in self.isolated:
            return Outcome(True, False, "already isolated")
        self.isolated[instance] = step.desired["fingerprint"]
        return Outcome(True, True, "isolated")

    async def verify(self, step: Step) -> Outcome:
        return Outcome(step.target.removeprefix("sidecar ") in self.isolated, False, "")

    async def revert(self, step: Step) -> Outcome:
        instance = step.target.removeprefix("sidecar ")
        holder = self.isolated.get(instance)
        if holder is not None and holder != step.desired["fingerprint"]:
            return Outcome(True, False, "isolated for another alert; left isolated")
        changed = self.isolated.pop(instance, None) is not None
        return Outcome(True, changed, "released")

    def out(self) -> set[str]:
        return set(self.isolated)


CONFIG = mapping.parse(
    {
        "execute": True,
        "namespaces": ["*"],
        "breaker": {"max_fraction": 1.0, "window": "1h"},
        "reassert_every": "30s",
        "rules": [
            {
                "name": "isolate",
                "alertname": "InferwatchGPUXidErrors",
                "action": "isolate_replica",
                "cooldown": "0s",
                "rollback_after": "1h",
            }
        ],
    },
    "test",
)


def alert(instance: str, fingerprint: str, status: str = "firing") -> Alert:
    labels = {"alertname": "InferwatchGPUXidErrors", "instance": instance}
    return Alert(status, labels, {}, STARTS, "0001-01-01T00:00:00Z", fingerprint)  # type: ignore[arg-type]


class Fleet:
    """A receiver on a state directory, restartable, and the sidecars it acts on."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.now = 1_000_000.0
        self.sidecars = FakeSidecars()
        self.audit_path = folder / "audit.jsonl"
        self.receiver = self._start()

    def _start(self) -> Dispatcher:
        listed = [{"instance": t, "model": "llama"} for t in TARGETS]
        return Dispatcher(
            CONFIG,
            {"isolate_replica": self.sidecars},
            AuditLog(self.audit_path),
            execute=True,
            store=DirectoryStore(self.folder / "state"),
            inventory=Inventory({"replicas": Static("replicas", listed)}),
            clock=lambda: self.now,
        )

    async def restart_receiver(self) -> None:
        self.receiver.audit.close()
        self.receiver = self._start()
        await self.receiver.episodes.resume()

    async def deliver(self, *alerts: Alert) -> None:
        for one in alerts:
            await self.receiver.handle_one(one, {})

    async def settle(self, seconds: float) -> None:
        """Time passes: what is due runs (rollbacks, the read-back of held targets)."""
        self.now += seconds
        await self.receiver.tick()

    def outcomes(self) -> list[str]:
        lines = self.audit_path.read_text().splitlines()
        return [json.loads(line)["outcome"] for line in lines]


Restart = str  # "receiver" or "sidecar"


async def episode(folder: Path, while_firing: list[Restart], while_held: list[Restart]) -> Fleet:
    """Two alerts fire on two replicas and on a shared third, resolve, and roll back, with
    the given restarts while they fire and while their rollbacks wait."""
    fleet = Fleet(folder)
    a, b, c = (alert(TARGETS[0], "aa"), alert(TARGETS[1], "bb"), alert(TARGETS[2], "cc"))
    shared = alert(TARGETS[2], "dd")  # a second alert wanting the third replica out
    await fleet.deliver(a, b, c, shared)
    assert fleet.sidecars.out() == set(TARGETS[:3])
    for restart in while_firing:
        if restart == "receiver":
            await fleet.restart_receiver()
        else:
            fleet.sidecars.isolated.clear()
        await fleet.settle(31)  # the read-back re-asserts what a restarted sidecar lost
        assert fleet.sidecars.out() == set(TARGETS[:3]), restart
    await fleet.deliver(*(alert(x.labels["instance"], x.fingerprint, "resolved") for x in (a, b)))
    await fleet.deliver(alert(TARGETS[2], "cc", "resolved"))
    for restart in while_held:
        if restart == "receiver":
            await fleet.restart_receiver()
        else:
            fleet.sidecars.isolated.clear()
        await fleet.settle(31)
    await fleet.settle(3601)  # the holds end: the rollbacks run
    assert fleet.sidecars.out() == {TARGETS[2]}  # still held by the firing 'dd'
    await fleet.deliver(alert(TARGETS[2], "dd", "resolved"))
    await fleet.settle(3601)
    assert fleet.sidecars.out() == set()
    return fleet


restarts = st.lists(st.sampled_from(["receiver", "sidecar"]), max_size=3)


@settings(max_examples=40, deadline=None)
@given(while_firing=restarts, while_held=restarts)
def test_any_restart_order_ends_with_the_same_targets_out_and_back(
    tmp_path_factory: pytest.TempPathFactory, while_firing: list[Restart], while_held: list[Restart]
) -> None:
    folder = tmp_path_factory.mktemp("episode")
    fleet = asyncio.run(episode(folder, while_firing, while_held))
    outcomes = fleet.outcomes()
    if "sidecar" in while_firing:
        assert "reasserted" in outcomes
    if "receiver" in while_held:
        assert "rollback_resumed" in outcomes
    assert outcomes.count("reverted") == 3  # aa, bb, and the third replica once, by dd


def test_no_restart_is_the_baseline(tmp_path: Path) -> None:
    outcomes = asyncio.run(episode(tmp_path, [], [])).outcomes()
    assert "reasserted" not in outcomes and "rollback_resumed" not in outcomes
    assert outcomes.count("rollback_held") == 1  # cc's rollback left the replica to dd


def test_every_order_of_restarting_both_during_an_episode(tmp_path: Path) -> None:
    for i, order in enumerate((["receiver", "sidecar"], ["sidecar", "receiver"])):
        for phase in ("firing", "held"):
            folder = tmp_path / f"{i}-{phase}"
            folder.mkdir()
            firing, held = (order, []) if phase == "firing" else ([], order)
            outcomes = asyncio.run(episode(folder, firing, held)).outcomes()
            assert outcomes.count("reverted") == 3, (order, phase, outcomes)
