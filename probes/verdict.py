"""Quality verdicts: windowed pass rates per target x model x version against a baseline.

Identical greedy requests can still come back different (batch composition changes the
numerics), and some goldens are simply hard for some models, so a single failure means
nothing. Instead:

* the **baseline** of a model version is the pass rate of each golden over the first
  ``baseline_cycles`` runs of it, captured when the version is first seen (pooled over
  the targets serving it, kept across restarts when a state file is given);
* the **window** of a target is its last ``window_cycles`` x set-size probe results;
* the verdict **fails** when the window's pass ratio falls more than ``max_drop`` below what
  the baseline predicts for the same probes, or below the absolute floor ``min_pass_ratio``
  (which also catches a version that was already broken when first seen). Until a window
  holds one full cycle the verdict is ``warming``.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

State = Literal["warming", "pass", "fail"]
STATES: Final[tuple[State, ...]] = ("warming", "pass", "fail")


@dataclass(frozen=True)
class Policy:
    window_cycles: int = 3
    baseline_cycles: int = 3
    max_drop: float = 0.10
    min_pass_ratio: float = 0.5


@dataclass(frozen=True)
class SeriesKey:
    """What a verdict is about: one target serving one model version."""

    target: str
    route: str
    model: str
    model_version: str


@dataclass(frozen=True)
class Verdict:
    state: State
    pass_ratio: float | None
    expected_ratio: float | None
    samples: int
    reason: str


@dataclass
class _Baseline:
    runs: dict[str, list[int]] = field(default_factory=dict)  # golden id -> [passes, runs]

    def add(self, golden_id: str, passed: bool, limit: int) -> None:
        passes_runs = self.runs.setdefault(golden_id, [0, 0])
        if passes_runs[1] < limit:
            passes_runs[0] += int(passed)
            passes_runs[1] += 1

    def complete(self, golden_ids: frozenset[str], limit: int) -> bool:
        return all(self.runs.get(g, (0, 0))[1] >= limit for g in golden_ids)

    def rate(self, golden_id: str) -> float | None:
        passes, runs = self.runs.get(golden_id, (0, 0))
        return passes / runs if runs else None


class Verdicts:
    """Results in, verdicts out; pure bookkeeping with no I/O except the optional state file."""

    def __init__(
        self,
        golden_ids: frozenset[str],
        policy: Policy | None = None,
        state_file: Path | None = None,
    ) -> None:
        self.golden_ids = golden_ids
        self.policy = policy or Policy()
        self.state_file = state_file
        self._windows: dict[SeriesKey, deque[tuple[str, bool]]] = {}
        self._baselines: dict[tuple[str, str], _Baseline] = self._load()

    @property
    def window_size(self) -> int:
        return self.policy.window_cycles * len(self.golden_ids)

    def record(self, key: SeriesKey, golden_id: str, passed: bool) -> None:
        window = self._windows.setdefault(key, deque(maxlen=self.window_size))
        window.append((golden_id, passed))
        baseline = self._baselines.setdefault((key.model, key.model_version), _Baseline())
        limit = self.policy.baseline_cycles
        if not baseline.complete(self.golden_ids, limit):
            baseline.add(golden_id, passed, limit)
            if baseline.complete(self.golden_ids, limit):
                self._save()

    def series(self) -> Iterator[SeriesKey]:
        return iter(list(self._windows))

    def exclude(self, golden_id: str) -> None:
        """Leave a probe out of every window and baseline: the engine cannot run it (see
        :mod:`inferwatch.probes.refusal`)."""
        if golden_id not in self.golden_ids:
            return
        self.golden_ids = self.golden_ids - {golden_id}
        self._windows = {
            key: deque((r for r in window if r[0] != golden_id), maxlen=self.window_size)
            for key, window in self._windows.items()
        }

    def baseline_complete(self, model: str, model_version: str) -> bool:
        baseline = self._baselines.get((model, model_version))
        return baseline is not None and baseline.complete(
            self.golden_ids, self.policy.baseline_cycles
        )

    def verdict(self, key: SeriesKey) -> Verdict:
        window = self._windows.get(key) or deque()
        samples = len(window)
        if samples == 0:
            return Verdict("warming", None, None, 0, "no probe results yet")
        ratio = sum(passed for _, passed in window) / samples
        expected = self._expected(key, window)
        if samples < len(self.golden_ids):
            return Verdict("warming", ratio, expected, samples, "first cycle not complete")
        if ratio < self.policy.min_pass_ratio:
            return Verdict(
                "fail",
                ratio,
                expected,
                samples,
                f"pass ratio {ratio:.2f} below the floor {self.policy.min_pass_ratio:.2f}",
            )
        if expected is None:
            return Verdict("warming", ratio, None, samples, "baseline still being captured")
        if ratio < expected - self.policy.max_drop:
            return Verdict(
                "fail",
                ratio,
                expected,
                samples,
                f"pass ratio {ratio:.2f} is {expected - ratio:.2f} below the baseline's "
                f"{expected:.2f}",
            )
        return Verdict("pass", ratio, expected, samples, "")

    def _expected(self, key: SeriesKey, window: deque[tuple[str, bool]]) -> float | None:
        if not self.baseline_complete(key.model, key.model_version):
            return None
        baseline = self._baselines[(key.model, key.model_version)]
        rates = [baseline.rate(golden_id) for golden_id, _ in window]
        known = [r for r in rates if r is not None]
        return sum(known) / len(known) if known else None

    def _load(self) -> dict[tuple[str, str], _Baseline]:
        if self.state_file is None or not self.state_file.exists():
            return {}
        document = json.loads(self.state_file.read_text(encoding="utf-8"))
        return {
            (entry["model"], entry["model_version"]): _Baseline(
                {g: [int(p), int(r)] for g, (p, r) in entry["runs"].items()}
            )
            for entry in document.get("baselines", [])
        }

    def _save(self) -> None:
        """Write completed baselines atomically, so a restart does not re-baseline."""
        if self.state_file is None:
            return
        entries = [
            {"model": model, "model_version": version, "runs": baseline.runs}
            for (model, version), baseline in sorted(self._baselines.items())
            if baseline.complete(self.golden_ids, self.policy.baseline_cycles)
        ]
        scratch = self.state_file.with_suffix(self.state_file.suffix + ".tmp")
        scratch.write_text(json.dumps({"baselines": entries}, indent=1, sort_keys=True))
        os.replace(scratch, self.state_file)
