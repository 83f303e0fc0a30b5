"""Compare a candidate with its baseline on every check and reach one verdict.

Each check ends ``pass``, ``fail``, ``no data`` (too small a sample for the test to mean
anything) or ``n/a`` (its metrics do not carry a label the selectors name, as probe series
carry model_version but not engine_version). A check fails only when the difference is both
statistically significant and larger than its tolerance: with a big enough window any
difference is significant, and a tolerance alone would call noise a regression. The verdict:
any failure rolls back, else any check without enough data is inconclusive, else promote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from inferwatch.canary import checks, stats
from inferwatch.canary.checks import Check
from inferwatch.canary.prometheus import Prometheus, PrometheusError, count, finite
from inferwatch.canary.selector import Selector
from inferwatch.mixin.config import Config

Outcome = Literal["pass", "fail", "no data", "n/a"]
Verdict = Literal["promote", "roll back", "inconclusive"]
EXIT_CODES: dict[Verdict, int] = {"promote": 0, "roll back": 1, "inconclusive": 2}


@dataclass(frozen=True)
class Thresholds:
    """Documented defaults; each is a CLI option."""

    #: significance level of every test (degeneracy: split over its signals, Bonferroni)
    alpha: float = 0.05
    #: requests per side before latency and error ratio are judged (a p99 needs >= 100)
    min_requests: int = 200
    #: probe runs per side (probes are few: a set every few minutes)
    min_probes: int = 30
    #: screened live outputs per side
    min_screened: int = 100
    #: billed tokens per side before cost per 1k tokens is compared
    min_tokens: int = 10_000
    #: a candidate p99 this much above the baseline's (relative) is a regression
    latency_tolerance: float = 0.10
    #: absolute increase of the error ratio that is a regression
    error_margin: float = 0.01
    #: absolute drop of the probe pass rate that is a regression
    probe_margin: float = 0.05
    #: absolute increase of the degenerate share that is a regression
    degeneracy_margin: float = 0.005
    #: relative increase of cost per 1k tokens that is a regression
    cost_tolerance: float = 0.10

    def proportion(self, check: Check) -> tuple[int, float]:
        """(minimum sample per side, margin) of a proportion check."""
        return {
            "error_ratio": (self.min_requests, self.error_margin),
            "probe_failures": (self.min_probes, self.probe_margin),
            "degeneracy": (self.min_screened, self.degeneracy_margin),
        }[check.name]


@dataclass(frozen=True)
class Result:
    check: Check
    outcome: Outcome
    baseline: str
    candidate: str
    #: the test's p-value, where a test ran
    p_value: float | None
    detail: str


def _bound(labels: dict[str, str]) -> float:
    """A bucket's upper bound; a bucket without a numeric one is a malformed answer."""
    try:
        bound = float(labels["le"])
    except (KeyError, ValueError):
        raise PrometheusError(f"a histogram bucket with le {labels.get('le')!r}") from None
    if math.isnan(bound):
        raise PrometheusError("a histogram bucket with le NaN")
    return bound


def _no_data(check: Check, baseline: str, candidate: str, why: str) -> Result:
    return Result(check, "no data", baseline, candidate, None, why)


def _share(events: int, total: int) -> str:
    return f"{events / total:.2%} of {total}" if total else "none"


class Analysis:
    def __init__(
        self,
        prometheus: Prometheus,
        config: Config,
        baseline: Selector,
        candidate: Selector,
        window: str,
        at: float,
        thresholds: Thresholds,
    ) -> None:
        self.prometheus = prometheus
        self.config = config
        self.sides = (baseline, candidate)
        self.window = window
        self.at = at
        self.thresholds = thresholds

    def run(self) -> list[Result]:
        results = []
        labels = self.sides[0].labels | self.sides[1].labels
        for check in checks.CHECKS:
            missing = checks.applicable(check, labels)
            if missing is not None:
                results.append(
                    Result(check, "n/a", "", "", None, f"its series carry no {missing} label")
                )
            elif check.kind == "latency":
                results.append(self._latency(check))
            elif check.kind == "proportion":
                results.append(self._proportion(check))
            else:
                results.append(self._cost(check))
        return results

    def _scalar(self, expr: str) -> float | None:
        return self.prometheus.scalar(expr, self.at)

    # ------------------------------------------------------------------ checks
    def _latency(self, check: Check) -> Result:
        t = self.thresholds
        cumulative: list[dict[float, float]] = []
        quantiles: list[float | None] = []
        for side in self.sides:
            selector = side.promql()
            buckets = self.prometheus.query(
                checks.buckets(self.config, check, selector, self.window), self.at
            )
            counts: dict[float, float] = {}
            for labels, value in buckets:
                # exporters spell a bound differently ("1", "1.0"): one bucket however spelt
                bound = _bound(labels)
                counts[bound] = counts.get(bound, 0.0) + value
            cumulative.append(counts)
            quantiles.append(
                self._scalar(checks.quantile(self.config, check, selector, self.window))
            )
        base, cand = cumulative
        n_b, n_c = count(base.get(math.inf)), count(cand.get(math.inf))
        shown = [
            f"{q * 1000:.0f} ms" if q is not None and not math.isnan(q) else "-" for q in quantiles
        ]
        if min(n_b, n_c) < t.min_requests:
            return _no_data(
                check,
                shown[0],
                shown[1],
                f"{n_b} and {n_c} requests, {t.min_requests} needed per side",
            )
        bounds = sorted(base)
        index = stats.tail_bound(bounds, [base[b] for b in bounds], checks.QUANTILE)
        if index is None:
            return _no_data(check, shown[0], shown[1], "the baseline's p99 lies in the +Inf bucket")
        bound = bounds[index]
        if bound not in cand:
            return _no_data(
                check,
                shown[0],
                shown[1],
                "baseline and candidate histograms have different buckets",
            )
        # rounding the extrapolated counts must not make a tail negative
        k_b, k_c = max(0, n_b - count(base[bound])), max(0, n_c - count(cand[bound]))
        p = stats.fisher_greater(k_c, n_c, k_b, n_b)
        q_b, q_c = quantiles
        if q_b is None or q_c is None or math.isnan(q_b) or math.isnan(q_c):
            return _no_data(check, shown[0], shown[1], "Prometheus gave no p99 for a side")
        slower = q_b is not None and q_c is not None and q_c > q_b * (1 + t.latency_tolerance)
        outcome: Outcome = "fail" if p < t.alpha and slower else "pass"
        detail = f"above {bound * 1000:g} ms: {_share(k_b, n_b)} vs {_share(k_c, n_c)}"
        return Result(check, outcome, shown[0], shown[1], p, detail)

    def _proportion(self, check: Check) -> Result:
        t = self.thresholds
        minimum, margin = t.proportion(check)
        alpha = t.alpha
        counted: list[tuple[dict[str, int], int]] = []
        for side in self.sides:
            events_expr, total_expr = checks.events_and_total(
                self.config, check, side.promql(), self.window
            )
            events = {
                labels.get("signal", ""): count(value)
                for labels, value in self.prometheus.query(events_expr, self.at)
            }
            counted.append((events or {"": 0}, count(self._scalar(total_expr))))
        (events_b, n_b), (events_c, n_c) = counted
        if min(n_b, n_c) < minimum:
            return _no_data(
                check, str(n_b), str(n_c), f"{n_b} and {n_c} observed, {minimum} needed per side"
            )
        signals = sorted(set(events_b) | set(events_c))
        alpha /= len(signals)  # one test per degeneracy signal
        worst: tuple[float, str, int, int] | None = None
        failed = False
        for signal in signals:
            k_b, k_c = min(events_b.get(signal, 0), n_b), min(events_c.get(signal, 0), n_c)
            p = stats.fisher_greater(k_c, n_c, k_b, n_b)
            failed |= p < alpha and k_c / n_c - k_b / n_b > margin
            if worst is None or p < worst[0]:
                worst = (p, signal, k_b, k_c)
        assert worst is not None
        p, signal, k_b, k_c = worst
        base, cand = _share(k_b, n_b), _share(k_c, n_c)
        if check.name == "probe_failures":
            base, cand = f"{1 - k_b / n_b:.2%} of {n_b}", f"{1 - k_c / n_c:.2%} of {n_c}"
        detail = f"{signal}, worst of {len(signals)} signals" if signal else ""
        return Result(check, "fail" if failed else "pass", base, cand, p, detail)

    def _cost(self, check: Check) -> Result:
        t = self.thresholds
        tokens = [
            count(self._scalar(checks.billed_tokens(self.config, side.promql(), self.window)))
            for side in self.sides
        ]
        if min(tokens) < t.min_tokens:
            return _no_data(
                check,
                str(tokens[0]),
                str(tokens[1]),
                f"{tokens[0]} and {tokens[1]} tokens, {t.min_tokens} needed per side",
            )
        baseline, candidate = (side.promql() for side in self.sides)
        compared = checks.cost_comparison(self.config, baseline, candidate, self.window)
        common = count(self._scalar(compared.tokens))
        if common < t.min_tokens:
            return _no_data(
                check, str(tokens[0]), str(tokens[1]),
                f"{common} tokens from tenants both sides served, {t.min_tokens} needed",
            )  # fmt: skip
        actual = finite(self._scalar(compared.actual))
        at_candidate = finite(self._scalar(compared.at_candidate))
        base, cand = 1000 * actual / common, 1000 * at_candidate / common
        dearer = cand > base * (1 + t.cost_tolerance)
        # counters give totals only, not the per-request spread a test would need
        detail = (
            f"tolerance {t.cost_tolerance:.0%}, the baseline's tenants at each side's rates, "
            "no test (totals only)"
        )
        return Result(
            check, "fail" if dearer else "pass", f"{base:.4g}", f"{cand:.4g}", None, detail
        )


def verdict(results: list[Result]) -> Verdict:
    outcomes = {r.outcome for r in results}
    if "fail" in outcomes:
        return "roll back"
    if "no data" in outcomes or "pass" not in outcomes:
        return "inconclusive"
    return "promote"
