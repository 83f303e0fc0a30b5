"""The probe runner's counters and histograms, rendered as catalogue families.

Kept as plain numbers (not a prometheus_client registry) so the runner can be embedded in
the sidecar as a ``MetricSource`` and served standalone with the same output.
"""

from __future__ import annotations

import time
from collections import defaultdict

from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.probes.scoring import Outcome
from inferwatch.probes.verdict import STATES, SeriesKey, Verdicts
from inferwatch.serving.histogram import DURATION_BUCKETS, TTFT_BUCKETS, Histogram


def _series(key: SeriesKey) -> tuple[str, str, str, str]:
    return (key.target, key.route, key.model, key.model_version)


class ProbeMetrics:
    def __init__(self, set_name: str) -> None:
        self.set_name = set_name
        self.runs: defaultdict[tuple[str, ...], int] = defaultdict(int)
        self.failures: defaultdict[tuple[str, ...], int] = defaultdict(int)
        self.tokens: defaultdict[tuple[str, ...], int] = defaultdict(int)
        #: when the token counters began: their ``_created`` samples, by which the proxy's
        #: reconciliation tells a restarted runner from one whose counters merely grew
        self.tokens_since = time.time()
        self.skipped: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.durations: dict[tuple[str, ...], Histogram] = {}
        self.ttfts: dict[tuple[str, ...], Histogram] = {}
        #: (target, probe) -> why the engine refuses it by configuration
        self.refused: dict[tuple[str, str], str] = {}

    def observe(self, key: SeriesKey, outcome: Outcome) -> None:
        series = _series(key)
        result = "pass" if outcome.passed else "fail"
        self.runs[(*series, self.set_name, outcome.golden.id, result)] += 1
        for check in outcome.failures:
            self.failures[(*series, self.set_name, check)] += 1
        reply = outcome.reply
        self.tokens[(*series, "prompt")] += reply.prompt_tokens
        self.tokens[(*series, "completion")] += reply.completion_tokens
        if reply.ok:
            self.durations.setdefault(series, Histogram(DURATION_BUCKETS)).observe(reply.total_s)
        if reply.ttft_s is not None:
            self.ttfts.setdefault(series, Histogram(TTFT_BUCKETS)).observe(reply.ttft_s)

    def skip(self, target: str, reason: str) -> None:
        self.skipped[(target, reason)] += 1

    def not_applicable(self, target: str, probe: str, reason: str) -> bool:
        """Record a probe the engine refuses by configuration; True when this is news."""
        news = self.refused.get((target, probe)) != reason
        self.refused[(target, probe)] = reason
        return news

    def applicable(self, target: str, probe: str) -> None:
        """The engine took the probe (its configuration changed, or it never refused it)."""
        self.refused.pop((target, probe), None)

    def families(self, verdicts: Verdicts, budget_remaining: float) -> list[Metric]:
        cat = catalog.load()
        runs, failures = cat.family("probe_runs"), cat.family("probe_check_failures")
        for labels, n in sorted(self.runs.items()):
            runs.add_metric(list(labels), n)
        for labels, n in sorted(self.failures.items()):
            failures.add_metric(list(labels), n)
        tokens, skipped = cat.family("probe_tokens"), cat.family("probe_skipped")
        for labels, n in sorted(self.tokens.items()):
            tokens.add_metric(list(labels), n, created=self.tokens_since)
        for pair, n in sorted(self.skipped.items()):
            skipped.add_metric(list(pair), n)
        durations, ttfts = cat.family("probe_duration"), cat.family("probe_ttft")
        for family, histograms in ((durations, self.durations), (ttfts, self.ttfts)):
            for series, histogram in sorted(histograms.items()):
                family.add_metric(list(series), histogram.buckets(), histogram.total)
        ratio, expected = cat.family("probe_pass_ratio"), cat.family("probe_expected_pass_ratio")
        state = cat.family("probe_verdict")
        for key in sorted(verdicts.series(), key=_series):
            series_labels = [*_series(key), self.set_name]
            verdict = verdicts.verdict(key)
            if verdict.pass_ratio is not None:
                ratio.add_metric(series_labels, verdict.pass_ratio)
            if verdict.expected_ratio is not None:
                expected.add_metric(series_labels, verdict.expected_ratio)
            for name in STATES:
                state.add_metric([*series_labels, name], float(name == verdict.state))
        remaining = cat.family("probe_budget_remaining")
        remaining.add_metric([], budget_remaining)
        refused = cat.family("probe_not_applicable")
        for (target, probe), reason in sorted(self.refused.items()):
            refused.add_metric([target, self.set_name, probe, reason], 1)
        return [
            runs,
            failures,
            ratio,
            expected,
            state,
            durations,
            ttfts,
            tokens,
            skipped,
            remaining,
            refused,
        ]
