"""An identity value nobody knows is spelled ``unknown`` by the sidecar and the proxy alike
(the probes always wrote it so), so that ``on(model, model_version)`` joins hold."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.identity import UNKNOWN
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import Exchange, ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.serving.page_fetch import EngineScraper

pytestmark = pytest.mark.unit

TGI_PAGE = (
    b"# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n"  # TGI labels nothing, not even a model
)


def test_sidecar_series_say_unknown_for_what_no_flag_or_engine_told(page_server: Any) -> None:
    page_server.page = TGI_PAGE
    engine = EngineCollector(
        EngineScraper(f"{page_server.url}/page/metrics", timeout_s=2.0), {"prompt_version": "v3"}
    )

    async def scrape() -> list[Any]:
        try:
            return list(await engine.collect()) + list(engine.status_families())
        finally:
            await engine.aclose()

    families = asyncio.run(scrape())
    for name in ("inferwatch_engine_requests_waiting", "inferwatch_engine_up"):
        (labels,) = [s.labels for f in families for s in f.samples if s.name == name]
        assert labels["model"] == labels["model_version"] == labels["engine_version"] == UNKNOWN
        assert labels["prompt_version"] == "v3" and labels["engine"] == "tgi"
        assert labels["pod"] == ""  # left to service discovery, never "unknown"


def test_proxy_series_say_unknown_for_missing_versions_and_model() -> None:
    app = ProxyApp(build(proxy_config.parse({}), access_log=False))
    unlabelled = Exchange(start=0.0, path="/v1/completions")
    app._label(unlabelled, [])
    assert unlabelled.identity[1:] == (UNKNOWN,) * 5  # versions, model and split (no gateway)
    labelled = Exchange(start=0.0, path="/v1/completions", model="m", status=200)
    app._label(labelled, [(b"x-model-version", b"2024-07-23")])
    app._served(labelled)  # values take their label slots once the engine served them
    assert labelled.identity[1:3] == ("m", "2024-07-23")
