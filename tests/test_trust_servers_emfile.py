"""Out of file descriptors, the sidecar blames itself, never the engine.

A socket the sidecar cannot open (EMFILE) says nothing of the engine: the scrape is counted as
the sidecar's own fault, the engine keeps its last known state, readiness names the sidecar,
and the health watch does not take it for an engine gone (which would log a restart and close
the warm-up gate).
"""

from __future__ import annotations

import asyncio
import errno

import httpx
import pytest

from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.exporters.startup.phases import GONE, NO_ANSWER, StartupTracker
from inferwatch.serving.page_fetch import EngineScraper, own_fault

pytestmark = pytest.mark.unit

PAGE = b'vllm:num_requests_running{model_name="m",engine="0"} 1\n'


def emfile() -> httpx.ConnectError:
    error = httpx.ConnectError("All connection attempts failed")
    error.__cause__ = OSError(errno.EMFILE, "Too many open files")
    return error


def collector(fail: list[bool]) -> EngineCollector:
    def handler(request: httpx.Request) -> httpx.Response:
        if fail[0]:
            raise emfile()
        if request.url.path != "/metrics":
            return httpx.Response(404)
        return httpx.Response(200, content=PAGE, headers={"Content-Type": "text/plain"})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    scraper = EngineScraper("http://engine:8000/metrics", timeout_s=5, client=client)
    return EngineCollector(scraper, {"pod": "p-0"}, engine="vllm")


def test_own_fault_is_found_through_the_causes() -> None:
    assert own_fault(emfile()) is not None
    assert own_fault(httpx.ConnectError("refused")) is None
    refused = httpx.ConnectError("refused")
    refused.__cause__ = ConnectionRefusedError(errno.ECONNREFUSED, "refused")
    assert own_fault(refused) is None


def test_a_scrape_without_descriptors_keeps_the_engine_up_and_names_the_sidecar() -> None:
    fail = [False]
    engine = collector(fail)
    sidecar = Sidecar([engine])

    async def scenario() -> None:
        await sidecar.gather(5)
        assert engine.up
        fail[0] = True
        families = await sidecar.gather(5)
        by_name = {f.name: f for f in families}
        assert by_name["inferwatch_engine_up"].samples[0].value == 1
        exhausted = by_name["inferwatch_sidecar_descriptor_exhaustion"].samples[0].value
        assert exhausted == 1
        assert "connect" not in engine.errors
        conditions = {c.name: c for c in sidecar.conditions()}
        assert conditions["engine"].ok
        assert not conditions["sidecar"].ok
        assert "Too many open files" in conditions["sidecar"].reason
        assert "sidecar" in conditions["sidecar"].reason
        fail[0] = False
        await sidecar.gather(5)
        assert "sidecar" not in {c.name for c in sidecar.conditions()}  # it recovered
        await sidecar.aclose()

    asyncio.run(scenario())


def test_the_health_watch_takes_no_socket_of_its_own_for_an_engine_gone() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise emfile()

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    async def scenario() -> None:
        engine = collector([True])
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        tracker = StartupTracker(engine, http=http)
        assert await tracker._health() == NO_ANSWER
        assert engine.own_faults == 1
        tracker.http = httpx.AsyncClient(transport=httpx.MockTransport(refused))
        assert await tracker._health() == GONE  # a refused connection still is one
        await engine.aclose()

    asyncio.run(scenario())
