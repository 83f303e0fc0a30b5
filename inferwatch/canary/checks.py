"""What a canary is judged on, and the PromQL that fetches each side's counts.

Every query asks for counts over the analysis window (``increase``), never for rates of the
recording rules: those are 5-minute rates grouped by model and model_version only, while a
canary window is longer and its selector may name engine_version or prompt_version. The
expressions follow the recording rules' definitions (a request is finished-without-error
plus errors, as in ``alerts.recording``; cost per 1k tokens is cost over prompt plus
completion tokens, as the ``cost_per_1k`` rule, compared tenant by tenant), and name metrics
only through the catalogue.
The Argo Rollouts and Flagger templates are built from the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inferwatch import catalog
from inferwatch.mixin.config import Config
from inferwatch.mixin.promql import metric, number
from inferwatch.wire import PROBE_TENANT

_NOT_ERROR = 'reason!="error"'
_FAILED = 'result="fail"'
_CUSTOMER = f'tenant!="{PROBE_TENANT}"'
_BILLED = 'token_type=~"prompt|completion"'

Kind = Literal["latency", "proportion", "cost"]
#: the latency quantile compared
QUANTILE = 0.99


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    kind: Kind
    #: catalogue keys the check reads; a selector label none of them carries makes it n/a
    keys: tuple[str, ...]


CHECKS = (
    Check("ttft_p99", "TTFT p99", "latency", ("engine_time_to_first_token",)),
    Check("tpot_p99", "TPOT p99", "latency", ("engine_time_per_output_token",)),
    Check(
        "error_ratio",
        "error ratio",
        "proportion",
        ("engine_requests_finished", "engine_request_errors"),
    ),
    Check("probe_failures", "probe pass rate", "proportion", ("probe_runs",)),
    Check(
        "degeneracy",
        "live degeneracy rate",
        "proportion",
        ("quality_sampled_outputs", "quality_degenerate_outputs"),
    ),
    Check("cost_per_1k", "cost per 1k tokens", "cost", ("tenancy_cost", "tenancy_tokens")),
)


def applicable(check: Check, labels: frozenset[str]) -> str | None:
    """None when every metric of ``check`` carries ``labels``, else the first one missing."""
    cat = catalog.load()
    for key in check.keys:
        missing = sorted(labels - set(cat[key].label_names))
        if missing:
            return missing[0]
    return None


def _increase(
    config: Config, key: str, selector: str, window: str, *matchers: str, suffix: str = ""
) -> str:
    return f"increase({metric(config, key, *matchers, selector, suffix=suffix)}[{window}])"


def buckets(config: Config, check: Check, selector: str, window: str) -> str:
    """Cumulative bucket counts by ``le`` over the window."""
    (key,) = check.keys
    return f"sum by (le) ({_increase(config, key, selector, window, suffix='_bucket')})"


def observed(config: Config, check: Check, selector: str, window: str) -> str:
    """Requests the latency histogram observed over the window."""
    (key,) = check.keys
    return f"sum({_increase(config, key, selector, window, suffix='_count')})"


def quantile(config: Config, check: Check, selector: str, window: str) -> str:
    return f"histogram_quantile({number(QUANTILE)}, {buckets(config, check, selector, window)})"


def events_and_total(config: Config, check: Check, selector: str, window: str) -> tuple[str, str]:
    """(events, sample) for a proportion check; degeneracy's events are ``by (signal)``."""
    if check.name == "error_ratio":
        errors = f"sum({_increase(config, 'engine_request_errors', selector, window)})"
        finished = (
            f"sum({_increase(config, 'engine_requests_finished', selector, window, _NOT_ERROR)})"
        )
        return errors, f"({finished} + ({errors} or {finished} * 0))"
    if check.name == "probe_failures":
        fail = f"sum({_increase(config, 'probe_runs', selector, window, _FAILED)})"
        return fail, f"sum({_increase(config, 'probe_runs', selector, window)})"
    if check.name == "degeneracy":
        degenerate = _increase(config, "quality_degenerate_outputs", selector, window)
        sampled = _increase(config, "quality_sampled_outputs", selector, window)
        return f"sum by (signal) ({degenerate})", f"sum({sampled})"
    raise ValueError(f"{check.name} is not a proportion check")


def billed_tokens(config: Config, selector: str, window: str) -> str:
    """Prompt plus completion tokens customers paid for (probe traffic is free and would
    dilute the comparison, so it is left out on both sides)."""
    return f"sum({_increase(config, 'tenancy_tokens', selector, window, _CUSTOMER, _BILLED)})"


@dataclass(frozen=True)
class CostComparison:
    """The baseline's customer traffic priced twice, over the tenants both sides served:
    ``actual`` is what it cost, ``at_candidate`` what it would have cost at the candidate's
    cost per token for each tenant (direct standardisation). Tenants' cost per token differs
    severalfold (long prompts against long completions), so comparing the two sides' plain
    cost per token would measure which tenants each side happened to serve in the window;
    this compares what the version changes (token mix within a tenant, cache hits, prices),
    and ``tokens`` (the baseline's billed tokens of those tenants) turns both into per-1k."""

    actual: str
    at_candidate: str
    tokens: str


def cost_comparison(config: Config, baseline: str, candidate: str, window: str) -> CostComparison:
    def by_tenant(key: str, selector: str, *matchers: str) -> str:
        return f"sum by (tenant) ({_increase(config, key, selector, window, _CUSTOMER, *matchers)})"

    cost_b, cost_c = (by_tenant("tenancy_cost", s) for s in (baseline, candidate))
    tokens_b, tokens_c = (by_tenant("tenancy_tokens", s, _BILLED) for s in (baseline, candidate))
    rate_c = f"({cost_c} / ({tokens_c} > 0))"
    return CostComparison(
        actual=f"sum({cost_b} and on (tenant) {rate_c})",
        at_candidate=f"sum({tokens_b} * on (tenant) {rate_c})",
        tokens=f"sum({tokens_b} and on (tenant) {rate_c})",
    )
