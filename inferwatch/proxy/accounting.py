"""What a finished request leaves behind: its charge (tokens and cost, the tenant's budget
reservation settled), the screening of a sampled response for degenerate output, its request
and latency series, and one access-log line."""

from __future__ import annotations

import logging
import time
import uuid

from inferwatch.logs import log_event
from inferwatch.probes.livesample import DegeneracySampler
from inferwatch.proxy.accesslog import AccessLog
from inferwatch.proxy.admission import Ledger
from inferwatch.proxy.config import Price, ProxyConfig, Tenant
from inferwatch.proxy.exchange import Exchange
from inferwatch.proxy.metrics import ProxyMetrics
from inferwatch.proxy.sampling import TranscribingMeter
from inferwatch.proxy.usagelog import Buffered
from inferwatch.wire import PROBE_TENANT

logger = logging.getLogger("inferwatch.proxy")


class Accounting:
    """Charges, screens and records each request once it is done (see the module docstring)."""

    def __init__(
        self,
        config: ProxyConfig,
        metrics: ProxyMetrics,
        ledger: Ledger,
        sampler: DegeneracySampler,
        access_log: AccessLog,
        usage_log: Buffered | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.ledger = ledger
        self.sampler = sampler
        self.access_log = access_log
        self.usage_log = usage_log
        self._warned_cached = False

    def charge(self, exchange: Exchange) -> None:
        """Charge what the request used, and settle its budget reservation either way."""
        meter = exchange.meter
        spent = 0
        if meter is not None and exchange.accounting:
            usage = exchange.usage = meter.usage()
            spent = usage.total
            # Quality probes are the operator's own traffic: their tokens are counted (so that
            # they reconcile with the engine's) but cost no tenant anything.
            if exchange.tenant != PROBE_TENANT:
                price = self.config.price(exchange.model)
                exchange.cost = price.cost(usage.prompt, usage.cached_prompt, usage.completion)
                if meter.reported is not None and not meter.prompt_details:
                    self._no_cached_details(exchange.model, price)
            self.metrics.charge(
                exchange.identity,
                usage,
                meter.source,
                exchange.accounting,
                exchange.cost,
                exchange.choices,
            )
            if self.usage_log is not None:
                self._log_usage(exchange)
            for token_type, reason in meter.anomalies:  # charged at a bound, not as reported
                self.metrics.usage_anomaly(token_type, reason)
        reservation, exchange.reservation = exchange.reservation, None
        tenant: Tenant | None = self.config.tenants.get(exchange.tenant)
        if reservation is not None and tenant is not None:
            self.ledger.settle(reservation, tenant.budget, spent)

    def _log_usage(self, exchange: Exchange) -> None:
        """One usage-log line, with the prices in force now (a later change bills later)."""
        assert self.usage_log is not None and exchange.usage is not None
        usage = exchange.usage
        price = self.config.price(exchange.model)
        self.usage_log.write(
            dict(
                ts=round(time.time(), 3),
                tenant=exchange.tenant,
                model=exchange.model,
                model_version=exchange.versions[0],
                prompt_tokens=usage.prompt,
                cached_prompt_tokens=usage.cached_prompt,
                completion_tokens=usage.completion,
                request_id=exchange.trace_id or uuid.uuid4().hex,
                price_prompt=price.prompt,
                price_cached_prompt=price.cached_prompt,
                price_completion=price.completion,
                busy_s=round(time.perf_counter() - exchange.start, 6),
            )
        )

    def _no_cached_details(self, model: str, price: Price) -> None:
        """Say once that a cached rate cannot apply: the engine reports no cached tokens."""
        if self._warned_cached or price.cached_prompt == price.prompt:
            return
        self._warned_cached = True
        log_event(
            logger,
            logging.WARNING,
            "prices have a cached prompt rate but the engine reports no cached tokens; "
            "every prompt token is priced at the full rate (vLLM reports them only with "
            "--enable-prompt-tokens-details)",
            model=model,
        )

    def screen(self, exchange: Exchange, meter: TranscribingMeter) -> None:
        """Screen a sampled response that arrived whole; partial text would mislead."""
        prompt, completion, has_tool_call = meter.take()
        if (
            exchange.outcome == "ok"
            and exchange.accounting == "complete"
            and not exchange.done_marker_missing
        ):
            _, model, model_version, *_ = exchange.identity  # bounded label values
            self.sampler.observe(
                model, model_version, prompt, completion, has_tool_call=has_tool_call
            )

    def finish(self, exchange: Exchange) -> None:
        duration = time.perf_counter() - exchange.start
        self.metrics.request(exchange.identity, exchange.outcome or "ok")
        if exchange.outcome in ("ok", "client_cancelled", "upstream_error") and exchange.meter:
            self.metrics.timing(exchange.identity, exchange.ttft, duration, exchange.trace_id)
        if not self.access_log.enabled:
            return
        usage = exchange.usage
        self.access_log.write(
            dict(
                tenant=exchange.tenant,
                tenant_via=exchange.via,
                path=exchange.path,
                model=exchange.model,
                model_version=exchange.versions[0],
                engine_version=exchange.versions[1],
                prompt_version=exchange.versions[2],
                stream=exchange.stream,
                status=exchange.status,
                outcome=exchange.outcome or "ok",
                accounting=exchange.accounting or None,
                usage_source=exchange.meter.source if usage and exchange.meter else None,
                prompt_tokens=usage.prompt if usage else 0,
                cached_prompt_tokens=usage.cached_prompt if usage else 0,
                completion_tokens=usage.completion if usage else 0,
                reasoning_tokens=usage.reasoning if usage else 0,
                cost=round(exchange.cost, 9),
                ttft_s=None if exchange.ttft is None else round(exchange.ttft, 6),
                duration_s=round(duration, 6),
                **({"error": exchange.error} if exchange.error else {}),
            )
        )
