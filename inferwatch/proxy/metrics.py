"""The proxy's counters and histograms, kept as plain dicts and rendered through the catalogue.

Plain dicts keyed by label tuples cost a fraction of prometheus_client's labelled children on
the request path, and they make folding an evicted tenant's series into ``other`` a re-key
rather than a delete, so no token ever disappears from the totals.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.proxy.admission import Refusal
from inferwatch.proxy.labels import OTHER
from inferwatch.proxy.usage import Usage
from inferwatch.serving.histogram import DURATION_BUCKETS, TTFT_BUCKETS_LONG, Histogram

#: refusals of the concurrency gate that shed a queued or queueing request, by reason
SHED_REASONS = {
    "rejected_queue_timeout": "queue_timeout",
    "rejected_queue_full": "queue_full",
    "rejected_shed": "priority",
}

#: (tenant, model, model_version, engine_version, prompt_version, split), catalogue identity
#: `tenant`
Identity = tuple[str, str, str, str, str, str]


#: identity positions, for folding one label's released values
IDENTITY_LABELS = ("tenant", "model", "model_version", "engine_version", "prompt_version", "split")


def _fold(series: MutableMapping[Any, Any], position: int, values: set[str], merge: Any) -> None:
    """Re-key every series whose identity label at ``position`` is in ``values`` to ``other``."""
    for key in [key for key in series if key[0][position] in values]:
        value = series.pop(key)
        identity = list(key[0])
        identity[position] = OTHER
        new_key: Any = (tuple(identity), *key[1:])
        series[new_key] = merge(series[new_key], value) if new_key in series else value


def _add(a: Any, b: Any) -> Any:
    return a + b


def _merge_histograms(a: Histogram, b: Histogram) -> Histogram:
    a.merge(b)
    return a


class ProxyMetrics:
    def __init__(self) -> None:
        self.tokens: dict[tuple[Identity, str, str], int] = {}
        self.cost: dict[tuple[Identity, str], float] = {}
        self.requests: dict[tuple[Identity, str], int] = {}
        self.accounted: dict[tuple[Identity, str, str], int] = {}
        self.ttft: dict[tuple[Identity], Histogram] = {}
        self.duration: dict[tuple[Identity], Histogram] = {}
        self.upstream_errors: dict[str, int] = {}
        #: (token type, reason) -> engine usage charged at a bound instead of as reported
        self.usage_anomalies: dict[tuple[str, str], int] = {}
        self.reconciliation_errors: dict[str, int] = {}
        #: usage-log appends refused by the volume and lines dropped (:mod:`.usagelog`)
        self.usage_log_errors: dict[str, int] = {}
        self.drift: dict[str, float] = {}
        #: time gated requests waited for a slot, and the ones shed, by tenant label
        self.queue_time: dict[tuple[tuple[str], ...], Histogram] = {}
        self.shed: dict[tuple[tuple[str], str], int] = {}
        #: the tokens the engine processed for every request charged since start, whatever the
        #: labels (reconciliation's side): a prompt counts once per choice, as engines count
        #: it, where usage reports it once
        self.charged = Usage()

    def request(self, identity: Identity, outcome: str) -> None:
        key = (identity, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1

    def charge(
        self,
        identity: Identity,
        usage: Usage,
        source: str,
        accounting: str,
        cost: float,
        choices: int = 1,
    ) -> None:
        """Add a finished request's usage; ``choices`` is how often the engine took its prompt."""
        tokens = self.tokens
        for token_type, count in usage.items():
            if count:
                key = (identity, token_type, source)
                tokens[key] = tokens.get(key, 0) + count
        cost_key = (identity, source)
        self.cost[cost_key] = self.cost.get(cost_key, 0.0) + cost
        accounted_key = (identity, source, accounting)
        self.accounted[accounted_key] = self.accounted.get(accounted_key, 0) + 1
        charged = self.charged
        charged.prompt += usage.prompt * choices
        charged.cached_prompt += usage.cached_prompt
        charged.completion += usage.completion
        charged.reasoning += usage.reasoning

    def timing(
        self, identity: Identity, ttft: float | None, duration: float, trace_id: str = ""
    ) -> None:
        """Observe a request's latencies; a traced request's id is their buckets' exemplar."""
        key = (identity,)
        if ttft is not None:
            histogram = self.ttft.get(key)
            if histogram is None:
                histogram = self.ttft[key] = Histogram(TTFT_BUCKETS_LONG)
            histogram.observe(ttft, trace_id)
        histogram = self.duration.get(key)
        if histogram is None:
            histogram = self.duration[key] = Histogram(DURATION_BUCKETS)
        histogram.observe(duration, trace_id)

    def queued(self, tenant: str, waited: float, refusal: Refusal | None) -> None:
        """A gated request's wait for its slot, and whether it was shed instead."""
        key = ((tenant,),)
        histogram = self.queue_time.get(key)
        if histogram is None:
            histogram = self.queue_time[key] = Histogram(DURATION_BUCKETS)
        histogram.observe(waited)
        reason = SHED_REASONS.get(refusal.reason) if refusal is not None else None
        if reason is not None:
            shed_key = ((tenant,), reason)
            self.shed[shed_key] = self.shed.get(shed_key, 0) + 1

    def upstream_error(self, reason: str) -> None:
        self.upstream_errors[reason] = self.upstream_errors.get(reason, 0) + 1

    def usage_anomaly(self, token_type: str, reason: str) -> None:
        key = (token_type, reason)
        self.usage_anomalies[key] = self.usage_anomalies.get(key, 0) + 1

    def fold(self, label: str, values: Iterable[str]) -> None:
        """Move the series of released values of one identity label into ``other``."""
        released = set(values)
        if not released:
            return
        position = IDENTITY_LABELS.index(label)
        for series in (self.tokens, self.requests, self.accounted):
            _fold(series, position, released, _add)
        _fold(self.cost, position, released, _add)
        _fold(self.ttft, position, released, _merge_histograms)
        _fold(self.duration, position, released, _merge_histograms)
        if label == "tenant":  # keyed by the tenant alone
            _fold(self.queue_time, position, released, _merge_histograms)
            _fold(self.shed, position, released, _add)

    def families(
        self,
        *,
        in_flight: int,
        waiting: int,
        budgets: dict[str, int],
        weights: dict[str, int],
        tenant_label_values: int,
        tenant_label_folds: int,
        value_label_folds: dict[str, int],
    ) -> list[Metric]:
        cat = catalog.load()
        out: list[Metric] = []

        def counter(key: str, series: dict[Any, Any]) -> None:
            family = cat.family(key)
            for labels, value in series.items():
                identity, *rest = labels
                family.add_metric([*identity, *rest], value)
            out.append(family)

        counter("tenancy_tokens", self.tokens)
        counter("tenancy_cost", self.cost)
        counter("tenancy_requests", self.requests)
        counter("tenancy_accounted_requests", self.accounted)
        counter("tenancy_shed", self.shed)
        for key, histograms in (
            ("tenancy_time_to_first_token", self.ttft),
            ("tenancy_request_duration", self.duration),
            ("tenancy_queue_time", self.queue_time),
        ):
            family = cat.family(key)
            for (identity,), histogram in histograms.items():
                family.add_metric(list(identity), histogram.buckets(), histogram.total)
            out.append(family)
        for key, plain in (
            ("tenancy_upstream_errors", self.upstream_errors),
            ("tenancy_reconciliation_errors", self.reconciliation_errors),
            ("tenancy_usage_log_errors", self.usage_log_errors),
            ("tenancy_reconciliation_drift", self.drift),
            ("tenancy_budget_remaining", budgets),
            ("tenancy_weight", weights),
            ("tenancy_value_label_folds", value_label_folds),
        ):
            family = cat.family(key)
            for label, value in sorted(plain.items()):
                family.add_metric([label], value)
            out.append(family)
        anomalies = cat.family("tenancy_engine_usage_anomalies")
        for (token_type, reason), value in sorted(self.usage_anomalies.items()):
            anomalies.add_metric([token_type, reason], value)
        out.append(anomalies)
        for key, value in (
            ("tenancy_requests_in_flight", in_flight),
            ("tenancy_requests_waiting", waiting),
            ("tenancy_tenant_label_values", tenant_label_values),
            ("tenancy_tenant_label_folds", tenant_label_folds),
        ):
            family = cat.family(key)
            family.add_metric([], value)
            out.append(family)
        return out
