"""What the proxies' own metrics say about the shared books: a tenant's spend over every
proxy, whether each proxy reaches Redis again with its journal replayed, and how far each
reconciling proxy's charges are from its engine's counters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence

import httpx

from inferwatch import catalog
from inferwatch.demo.signals import Scrape


def _name(key: str) -> str:
    return catalog.load()[key].name


async def pages(http: httpx.AsyncClient, urls: Iterable[str]) -> list[Scrape | None]:
    """Each proxy's tenant metrics page (None for one that did not answer)."""

    async def one(url: str) -> Scrape | None:
        try:
            response = await http.get(url + "/metrics", timeout=2.0)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        return Scrape.parse(time.monotonic(), response.content)

    return list(await asyncio.gather(*(one(url) for url in urls)))


def spent(scrapes: Sequence[Scrape | None], tenant: str) -> float | None:
    """Prompt and completion tokens charged to ``tenant`` over every proxy; None when a proxy
    did not answer (a sum without it would undercount)."""
    if any(page is None for page in scrapes):
        return None
    return sum(
        page.total(
            _name("tenancy_tokens"),
            lambda labels: (
                labels.get("tenant") == tenant
                and labels.get("token_type") in ("prompt", "completion")
            ),
        )
        or 0.0
        for page in scrapes
        if page is not None
    )


def replayed(scrapes: Sequence[Scrape | None]) -> bool:
    """Every proxy reaches its shared state and has no journaled usage left to replay."""
    return all(
        page is not None
        and page.total(_name("tenancy_shared_state_up")) == 1
        and not page.total(_name("tenancy_shared_state_journal_entries"))
        for page in scrapes
    )


def drift(scrapes: Sequence[Scrape | None]) -> float | None:
    """The largest token difference between a reconciling proxy's charges and its engine's
    counters; None when a proxy did not answer or none reconciles."""
    if any(page is None for page in scrapes):
        return None
    gaps = [
        abs(value)
        for page in scrapes
        if page is not None
        for _, value in page.values(_name("tenancy_reconciliation_drift"))
    ]
    return max(gaps) if gaps else None
