"""The quality gate: the same golden set and a short load run against two endpoints.

Typical use is a CI step before promoting a quantized model or an engine upgrade: the
baseline is what serves today, the candidate what would replace it. The gate passes when

* the candidate's pass rate is not lower by ``max_drop`` or more with the drop being
  significant (the 95 % Newcombe interval of the difference lies wholly below zero), so one
  flipped answer out of a hundred from greedy nondeterminism does not fail a build; and
* median TTFT and TPOT are not worse, and throughput not lower, by more than
  ``latency_tolerance`` (relative, plus ``latency_slack_s`` absolute for tiny numbers).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import httpx

from inferwatch.probes import client, degeneracy
from inferwatch.probes.golden import Golden, GoldenSet
from inferwatch.probes.reply import Reply
from inferwatch.probes.scoring import Limits, score
from inferwatch.probes.stats import Difference, newcombe, percentile

LOAD_PROMPT: Final = (
    "Explain in about one hundred words how a lighthouse helps ships at night, in plain sentences."
)


class CouldNotRun(Exception):
    """An endpoint answered with replies the gate cannot read: no verdict can be given."""


def _readable(endpoint: client.Endpoint, reply: Reply) -> Reply:
    if reply.error == client.UNREADABLE:
        raise CouldNotRun(
            f"{endpoint.url}: replies are not readable JSON (nested too deeply or numbers out "
            "of range); cannot judge quality"
        )
    return reply


@dataclass(frozen=True)
class Thresholds:
    max_drop: float = 0.01
    latency_tolerance: float = 0.10
    latency_slack_s: float = 0.002


@dataclass(frozen=True)
class LoadSettings:
    requests: int = 32
    concurrency: int = 4
    max_tokens: int = 128


@dataclass
class Quality:
    passes: int = 0
    runs: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # check -> count
    failed_probes: Counter[str] = field(default_factory=Counter)  # golden id -> count

    @property
    def rate(self) -> float:
        return self.passes / self.runs if self.runs else 0.0


@dataclass(frozen=True)
class Load:
    requests: int
    errors: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    throughput_tokens_per_s: float


@dataclass(frozen=True)
class Comparison:
    name: str
    baseline: float | None
    candidate: float | None
    ok: bool
    detail: str


@dataclass(frozen=True)
class GateReport:
    golden_set: str
    repeats: int
    baseline: Quality
    candidate: Quality
    difference: Difference
    baseline_load: Load
    candidate_load: Load
    comparisons: tuple[Comparison, ...]

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.comparisons)

    @property
    def regressed_probes(self) -> list[str]:
        """Goldens that failed more often on the candidate than on the baseline."""
        return sorted(
            g
            for g, n in self.candidate.failed_probes.items()
            if n > self.baseline.failed_probes.get(g, 0)
        )

    def as_json(self) -> dict[str, Any]:
        def quality(q: Quality) -> dict[str, Any]:
            return {
                "passes": q.passes,
                "runs": q.runs,
                "pass_rate": q.rate,
                "failures_by_check": dict(sorted(q.failures.items())),
            }

        return {
            "verdict": "pass" if self.passed else "fail",
            "golden_set": self.golden_set,
            "repeats": self.repeats,
            "quality": {
                "baseline": quality(self.baseline),
                "candidate": quality(self.candidate),
                "delta": self.difference.delta,
                "ci95": [self.difference.low, self.difference.high],
                "regressed_probes": self.regressed_probes,
            },
            "load": {
                "baseline": asdict(self.baseline_load),
                "candidate": asdict(self.candidate_load),
            },
            "checks": [asdict(c) for c in self.comparisons],
        }


async def run_quality(
    http: httpx.AsyncClient,
    endpoint: client.Endpoint,
    goldens: GoldenSet,
    repeats: int,
    limits: Limits,
) -> Quality:
    """Every golden ``repeats`` times, one request at a time (as the probe runner sends them)."""
    quality = Quality()
    for _ in range(repeats):
        for golden in goldens.probes:
            reply = await client.send(http, endpoint, golden, limits.total_s)
            outcome = score(golden, _readable(endpoint, reply), limits)
            quality.runs += 1
            quality.passes += outcome.passed
            quality.failures.update(outcome.failures.keys())
            if not outcome.passed:
                quality.failed_probes[golden.id] += 1
    return quality


def _load_request(max_tokens: int) -> Golden:
    return Golden(
        id="load",
        tags=(),
        messages=({"role": "user", "content": LOAD_PROMPT},),
        tools=(),
        max_tokens=max_tokens,
        scripts=degeneracy.allowed_scripts(LOAD_PROMPT),
        answer=None,
        tool_call=None,
        checks=(),
    )


async def run_load(
    http: httpx.AsyncClient, endpoint: client.Endpoint, settings: LoadSettings, timeout_s: float
) -> Load:
    """``settings.requests`` streamed requests, ``settings.concurrency`` at a time."""
    request = _load_request(settings.max_tokens)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(settings.requests):
        queue.put_nowait(i)
    ttfts: list[float] = []
    tpots: list[float] = []
    tokens = errors = 0

    async def worker() -> None:
        nonlocal tokens, errors
        while not queue.empty():
            queue.get_nowait()
            reply = _readable(endpoint, await client.send(http, endpoint, request, timeout_s))
            if not reply.ok or reply.ttft_s is None:
                errors += 1
                continue
            ttfts.append(reply.ttft_s)
            tokens += reply.completion_tokens
            if reply.completion_tokens > 1:
                tpots.append((reply.total_s - reply.ttft_s) / (reply.completion_tokens - 1))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(settings.concurrency)))
    elapsed = time.perf_counter() - started
    return Load(
        requests=settings.requests,
        errors=errors,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        tpot_p50_s=percentile(tpots, 50),
        tpot_p90_s=percentile(tpots, 90),
        throughput_tokens_per_s=tokens / elapsed if elapsed > 0 else 0.0,
    )


def _latency(name: str, base: float | None, cand: float | None, t: Thresholds) -> Comparison:
    if base is None or cand is None:
        return Comparison(name, base, cand, False, "no measurement (every request failed)")
    limit = base * (1 + t.latency_tolerance) + t.latency_slack_s
    return Comparison(name, base, cand, cand <= limit, f"limit {limit * 1000:.1f} ms")


def compare(
    goldens: GoldenSet,
    repeats: int,
    baseline: Quality,
    candidate: Quality,
    baseline_load: Load,
    candidate_load: Load,
    thresholds: Thresholds,
) -> GateReport:
    difference = newcombe(baseline.passes, baseline.runs, candidate.passes, candidate.runs)
    dropped = -difference.delta >= thresholds.max_drop and difference.significant_drop
    floor = baseline_load.throughput_tokens_per_s * (1 - thresholds.latency_tolerance)
    comparisons = (
        Comparison(
            "pass_rate",
            baseline.rate,
            candidate.rate,
            not dropped,
            f"drop limit {thresholds.max_drop * 100:.1f} pts, significant at 95 %",
        ),
        _latency("ttft_p50", baseline_load.ttft_p50_s, candidate_load.ttft_p50_s, thresholds),
        _latency("tpot_p50", baseline_load.tpot_p50_s, candidate_load.tpot_p50_s, thresholds),
        Comparison(
            "throughput",
            baseline_load.throughput_tokens_per_s,
            candidate_load.throughput_tokens_per_s,
            candidate_load.throughput_tokens_per_s >= floor and candidate_load.errors == 0,
            f"floor {floor:.1f} tokens/s, no errors",
        ),
    )
    return GateReport(
        goldens.name,
        repeats,
        baseline,
        candidate,
        difference,
        baseline_load,
        candidate_load,
        comparisons,
    )


async def run_gate(
    http: httpx.AsyncClient,
    baseline: client.Endpoint,
    candidate: client.Endpoint,
    goldens: GoldenSet,
    *,
    repeats: int = 3,
    load: LoadSettings | None = None,
    thresholds: Thresholds | None = None,
    limits: Limits | None = None,
) -> GateReport:
    """Quality on both endpoints at once, then the load runs one after the other."""
    thresholds = thresholds or Thresholds()
    limits = limits or Limits()
    base_quality, cand_quality = await asyncio.gather(
        run_quality(http, baseline, goldens, repeats, limits),
        run_quality(http, candidate, goldens, repeats, limits),
    )
    load = load or LoadSettings()
    base_load = await run_load(http, baseline, load, limits.total_s)
    cand_load = await run_load(http, candidate, load, limits.total_s)
    return compare(goldens, repeats, base_quality, cand_quality, base_load, cand_load, thresholds)


def _cell(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if name == "pass_rate":
        return f"{value * 100:.1f}%"
    if name == "throughput":
        return f"{value:.1f} tok/s"
    return f"{value * 1000:.1f} ms"


def _delta(name: str, c: Comparison, report: GateReport) -> str:
    if name == "pass_rate":
        d = report.difference
        return f"{d.delta * 100:+.1f} pts [{d.low * 100:+.1f}, {d.high * 100:+.1f}]"
    if c.baseline in (None, 0) or c.candidate is None:
        return "-"
    assert c.baseline is not None
    return f"{(c.candidate / c.baseline - 1) * 100:+.1f}%"


def render_table(report: GateReport, baseline_url: str, candidate_url: str) -> str:
    rows = [("check", "baseline", "candidate", "delta", "result")]
    for c in report.comparisons:
        rows.append(
            (
                c.name,
                _cell(c.name, c.baseline),
                _cell(c.name, c.candidate),
                _delta(c.name, c, report),
                ("ok" if c.ok else "FAIL") + f" ({c.detail})",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        f"baseline  {baseline_url}",
        f"candidate {candidate_url}",
        f"golden set {report.golden_set}: {report.baseline.runs} probes per endpoint "
        f"({report.repeats} repeats)",
        "",
    ]
    for row in rows:
        lines.append(
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
        )
    if report.regressed_probes:
        lines.append("")
        lines.append("regressed probes: " + ", ".join(report.regressed_probes))
    lines.append("")
    lines.append("verdict: " + ("PASS" if report.passed else "FAIL"))
    return "\n".join(lines)
