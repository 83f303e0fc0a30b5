"""Scripted fault scenarios: a timeline of injections into the demo's simulated replicas.

A scenario is a YAML file (the shipped ones live in ``scenarios/``)::

    name: gpu-failure
    description: What it shows, in a sentence or two.
    steps:
      - at: 20s                      # seconds after the fleet is up (30, 30s, 1m30s, 2m)
        replica: primary-v1          # or replicas: [primary-v1, primary-v2]
        inject: {gpu: [{index: 0, xid: 79}]}   # a fault document (see inferwatch.sim.faults)
        say: XID 79 on primary-v1    # optional; shown in the event log
      - at: 50s
        replica: primary-v1
        repair: true                 # reset the GPU (clear its faults) and restart the pod
      - at: 55s
        replica: primary-v2
        clear: true                  # clear faults that need no repair (slow, degenerate, ...)
      - at: 60s
        replica: fallback
        crash: true                  # SIGKILL the engine process (``repair`` starts it)
      - at: 60s
        rate: 9                      # the load generator's requests per second
      - at: 70s
        replica: primary-v1b         # a spare (topology.SPARES), not running until now
        start: true                  # a scale-out: start its engine, sidecar and proxy
        inject: {slow_factor: 10}    # optional with start: faults it starts with

Everything is checked before the demo starts anything: an unknown replica, a misspelt fault or
a bad time is one error line naming the file and step. Injections go through each simulator's
``/admin/faults`` endpoint with its bearer token, as an operator's tooling would. A GPU that
needed a reset stays unready in its sidecar until the pod restarts (the sidecar latches such
faults), which is why ``repair`` restarts the replica's sidecar after clearing the faults.
A spare replica is started once, by a ``start`` step, and takes no other step before it; its
``inject`` document (on hardware as slow as the fleet's, say) is the faults it starts with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from inferwatch import config as layer
from inferwatch.config.schema import duration_of
from inferwatch.sim import faults as fault_doc

GPUS_PER_REPLICA = 1  # every demo replica serves from one GPU
#: what ``inferwatch demo`` plays without ``--scenario``: one fault and its repair
DEFAULT = "xid-and-repair"
#: the ``--scenario`` value for a run without faults
NONE = "none"
_STEP_KEYS = {
    "at", "replica", "replicas", "inject", "clear", "crash", "repair", "rate", "start", "say",
}  # fmt: skip
Action = Literal["start", "inject", "clear", "crash", "repair", "rate"]
_ACTIONS: tuple[Action, ...] = ("start", "inject", "clear", "crash", "repair", "rate")


class ScenarioError(layer.ConfigError):
    """A scenario that cannot be run; the message names the file, step and field."""


@dataclass(frozen=True)
class Step:
    at: float
    action: Action
    replicas: tuple[str, ...] = ()
    faults: Mapping[str, Any] | None = None
    rate: float = 0.0
    say: str = ""

    def describe(self) -> str:
        if self.say:
            return self.say
        if self.action == "rate":
            return f"load set to {self.rate:g} requests/s"
        where = ", ".join(self.replicas)
        if self.action == "clear":
            return f"faults cleared on {where}"
        if self.action == "crash":
            return f"engine process killed on {where}"
        if self.action == "repair":
            return f"repaired {where}: engine up, faults cleared, GPU reset, pod restarted"
        if self.action == "start":
            faults = (
                f" with {json.dumps(self.faults, separators=(',', ':'))}" if self.faults else ""
            )
            return f"scale-out: {where} started{faults}"
        return f"inject {json.dumps(self.faults, separators=(',', ':'))} on {where}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    steps: tuple[Step, ...]

    @property
    def spares(self) -> tuple[str, ...]:
        """The spare replicas the scenario starts, in the order it starts them."""
        return tuple(name for s in self.steps if s.action == "start" for name in s.replicas)


def shipped() -> list[str]:
    """Names of the scenarios that come with inferwatch."""
    folder = resources.files("inferwatch.demo") / "scenarios"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load(spec: str, replicas: Sequence[str], spares: Sequence[str] = ()) -> Scenario:
    """A shipped scenario by name, or a YAML file by path; raises ScenarioError.

    ``replicas`` run from t=0; ``spares`` are the replicas a ``start`` step may start."""
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScenarioError(f"scenario {spec}: cannot read: {exc.strerror}") from None
        source = spec
    elif spec in shipped():
        resource = resources.files("inferwatch.demo") / "scenarios" / f"{spec}.yaml"
        text, source = resource.read_text(encoding="utf-8"), f"scenario {spec}"
    else:
        raise ScenarioError(
            f"unknown scenario {spec!r}; shipped: {', '.join(shipped())} (or give a YAML file)"
        )
    document = layer.parse(text, source, ScenarioError)
    return parse(document, source, replicas, spares)


def parse(
    document: Any, source: str, replicas: Sequence[str], spares: Sequence[str] = ()
) -> Scenario:
    if not isinstance(document, Mapping):
        raise ScenarioError(f"{source}: expected a mapping with name, description and steps")
    unknown = sorted(set(document) - {"name", "description", "steps"})
    if unknown:
        raise ScenarioError(f"{source}: unknown field {unknown[0]!r}")
    raw_steps = document.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise ScenarioError(f"{source}: steps: expected a non-empty list")
    known = [*replicas, *spares]
    steps = [(_step(raw, f"{source}: steps[{i}]", known), i) for i, raw in enumerate(raw_steps)]
    steps.sort(key=lambda pair: pair[0].at)
    _check_spares(steps, source, spares)
    return Scenario(
        name=str(document.get("name") or Path(source).stem),
        description=" ".join(str(document.get("description", "")).split()),
        steps=tuple(step for step, _ in steps),
    )


def _check_spares(steps: Sequence[tuple[Step, int]], source: str, spares: Sequence[str]) -> None:
    """A ``start`` names spares only, each once; no other step reaches a spare before it."""
    started: set[str] = set()
    for step, index in steps:
        where = f"{source}: steps[{index}]"
        for name in step.replicas:
            if step.action == "start":
                if name not in spares:
                    raise ScenarioError(
                        f"{where}.start: {name} runs from the start; start takes a spare "
                        f"({', '.join(spares) or 'none'})"
                    )
                if name in started:
                    raise ScenarioError(f"{where}.start: {name} is already started")
                started.add(name)
            elif name in spares and name not in started:
                raise ScenarioError(f"{where}: {name} is a spare, not started before this step")


def _step(raw: Any, where: str, replicas: Sequence[str]) -> Step:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected a mapping")
    unknown = sorted(set(raw) - _STEP_KEYS)
    if unknown:
        raise ScenarioError(f"{where}: unknown field {unknown[0]!r} (known: {sorted(_STEP_KEYS)})")
    if "at" not in raw:
        raise ScenarioError(f"{where}.at: required")
    # a start may carry the faults its replica starts with
    actions = [a for a in _ACTIONS if a in raw and not (a == "inject" and "start" in raw)]
    if len(actions) != 1:
        raise ScenarioError(f"{where}: needs exactly one of {', '.join(_ACTIONS)}")
    action = actions[0]
    fail = lambda reason: ScenarioError(f"{where}.at: {reason}")  # noqa: E731
    at = duration_of(raw["at"], fail, seconds_int=True).seconds
    say = str(raw.get("say", ""))
    if action == "rate":
        rate = raw["rate"]
        if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 0:
            raise ScenarioError(f"{where}.rate: expected requests per second >= 0, got {rate!r}")
        return Step(at, "rate", rate=float(rate), say=say)
    targets = _targets(raw, where, replicas)
    if action != "inject" and raw[action] is not True:
        raise ScenarioError(f"{where}.{action}: expected true")
    if "inject" not in raw:
        return Step(at, action, targets, say=say)
    try:  # the simulator's own validation, so that a bad document fails now, not at t=40s
        fault_doc.parse(raw["inject"], fault_doc.Faults(), gpu_count=GPUS_PER_REPLICA)
    except fault_doc.FaultError as exc:
        raise ScenarioError(f"{where}.inject: {exc}") from None
    return Step(at, action, targets, faults=raw["inject"], say=say)


def _targets(raw: Mapping[str, Any], where: str, replicas: Sequence[str]) -> tuple[str, ...]:
    if ("replica" in raw) == ("replicas" in raw):
        raise ScenarioError(f"{where}: needs replica: NAME or replicas: [NAMES]")
    names = [raw["replica"]] if "replica" in raw else raw["replicas"]
    if not isinstance(names, list) or not names:
        raise ScenarioError(f"{where}.replicas: expected a non-empty list of replica names")
    for name in names:
        if name not in replicas:
            raise ScenarioError(
                f"{where}: unknown replica {name!r} (replicas: {', '.join(replicas)})"
            )
    return tuple(str(name) for name in names)
