"""``/probe?target=&module=``: one probe run per Prometheus scrape (blackbox-exporter style).

The module is a golden set; the target is the OpenAI-compatible base URL of a replica or a
router. Prometheus owns the cadence (``scrape_interval``) and the time allowed (the
``X-Prometheus-Scrape-Timeout-Seconds`` header, less a margin); probes still unsent when that
time is up count as failed with check ``deadline``. Every request gets fresh samples.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Final

import httpx
from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.probes import client
from inferwatch.probes.golden import Golden
from inferwatch.probes.scoring import Limits, score

SCRAPE_TIMEOUT_MARGIN: Final = 0.5
DEFAULT_TIMEOUT: Final = 10.0


async def run_module(
    http: httpx.AsyncClient,
    endpoint: client.Endpoint,
    goldens: Sequence[Golden],
    limits: Limits,
    timeout_s: float,
) -> list[Metric]:
    """Run ``goldens`` against ``endpoint`` one at a time and return the request's families."""
    started = time.perf_counter()
    deadline = started + timeout_s
    results: dict[str, bool] = {}
    failures: Counter[str] = Counter()
    for golden in goldens:
        left = deadline - time.perf_counter()
        if left <= 0:
            failures["deadline"] += 1
            results[golden.id] = False
            continue
        outcome = score(golden, await client.send(http, endpoint, golden, left), limits)
        results[golden.id] = outcome.passed
        failures.update(outcome.failures.keys())
    cat = catalog.load()
    success, duration = cat.family("probe_success"), cat.family("probe_request_duration")
    success.add_metric([], float(all(results.values())))
    duration.add_metric([], time.perf_counter() - started)
    result, failed = cat.family("probe_result"), cat.family("probe_request_check_failures")
    for probe_id, passed in results.items():
        result.add_metric([probe_id], float(passed))
    for check, count in sorted(failures.items()):
        failed.add_metric([check], count)
    return [success, duration, result, failed]


def scrape_timeout(header: str | None) -> float:
    """Seconds this probe may take, from Prometheus' scrape-timeout header."""
    try:
        return max(float(header) - SCRAPE_TIMEOUT_MARGIN, 0.1) if header else DEFAULT_TIMEOUT
    except ValueError:
        return DEFAULT_TIMEOUT


def failed(count: int, check: str = "discovery") -> list[Metric]:
    """The families of a /probe request that could not start (no model to ask for)."""
    cat = catalog.load()
    success, duration = cat.family("probe_success"), cat.family("probe_request_duration")
    success.add_metric([], 0.0)
    duration.add_metric([], 0.0)
    failures = cat.family("probe_request_check_failures")
    failures.add_metric([check], count)
    return [success, duration, failures]
