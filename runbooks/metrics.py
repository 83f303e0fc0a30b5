"""The receiver's own metrics, as catalogue families."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.serving.histogram import Histogram

#: alert start to action applied: Alertmanager's group_wait and the rule's for: dominate
ALERT_TO_ACTION_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class RunbookMetrics:
    def __init__(self) -> None:
        self.webhooks: Counter[str] = Counter()
        self.actions: Counter[tuple[str, str]] = Counter()
        self.unmapped = 0
        self.alert_to_action: dict[str, Histogram] = {}

    def observe_applied(self, action: str, seconds: float) -> None:
        histogram = self.alert_to_action.setdefault(action, Histogram(ALERT_TO_ACTION_BUCKETS))
        histogram.observe(max(seconds, 0.0))

    def families(
        self, breaker_open: Iterable[tuple[str, str]], execute: bool, skipped_episodes: int
    ) -> list[Metric]:
        cat = catalog.load()
        webhooks = cat.family("runbooks_webhooks")
        for outcome, count in sorted(self.webhooks.items()):
            webhooks.add_metric([outcome], count)
        actions = cat.family("runbooks_actions")
        for (action, outcome), count in sorted(self.actions.items()):
            actions.add_metric([action, outcome], count)
        unmapped = cat.family("runbooks_unmapped_alerts")
        unmapped.add_metric([], self.unmapped)
        skipped = cat.family("runbooks_state_episodes_skipped")
        skipped.add_metric([], skipped_episodes)
        breaker = cat.family("runbooks_breaker_open")
        for unit, group in sorted(breaker_open):
            breaker.add_metric([unit, group], 1)
        mode = cat.family("runbooks_execute")
        mode.add_metric([], int(execute))
        latency = cat.family("runbooks_alert_to_action")
        for action, histogram in sorted(self.alert_to_action.items()):
            latency.add_metric([action], histogram.buckets(), histogram.total)
        return [webhooks, actions, unmapped, skipped, breaker, mode, latency]
