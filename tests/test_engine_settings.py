"""``inferwatch_engine_setting``: the settings each engine tells about itself, read strictly
(label values and JSON fields are the engine's to write), absent where it tells none."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch.exporters.engine import adapters as engines
from inferwatch.exporters.engine.adapters import settings
from inferwatch.exporters.engine.collector import BAD_SETTING, EngineCollector
from inferwatch.serving import textformat
from inferwatch.serving.page_fetch import EngineScraper

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "engines"


def _page(text: str, engine: str) -> textformat.Exposition:
    return textformat.parse(text.encode(), wanted=engines.wanted(engine))


def _cache_info(*utilizations: str) -> str:
    lines = ["# TYPE vllm:cache_config_info gauge"]
    for rank, value in enumerate(utilizations):
        lines.append(
            f'vllm:cache_config_info{{block_size="16",engine="{rank}",'
            f'gpu_memory_utilization="{value}",num_gpu_blocks="100"}} 1.0'
        )
    lines += [
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "name", ["vllm-generated-0.33.0-1engine", "vllm-generated-0.33.0-specdec-lora"]
)
def test_vllm_page_tells_gpu_memory_utilization(name: str) -> None:
    body = (FIXTURES / f"{name}.prom").read_bytes()
    page = textformat.parse(body, wanted=engines.wanted("vllm"))
    assert engines.page_settings(page, "vllm") == ({"gpu_memory_utilization": 0.92}, 0)


def test_data_parallel_ranks_give_the_largest() -> None:
    assert engines.page_settings(_page(_cache_info("0.9", "0.95"), "vllm"), "vllm") == (
        {"gpu_memory_utilization": 0.95},
        0,
    )


@pytest.mark.parametrize(
    "label", ["nan", "NaN", "inf", "+Inf", "1e999", "0x1", "1_0", "0.9 ", "abc", "1.5", "[]"]
)
def test_a_garbage_label_value_is_left_out_and_counted(label: str) -> None:
    page = _page(_cache_info(label), "vllm")
    assert engines.page_settings(page, "vllm") == ({}, 1)


def test_one_garbage_rank_leaves_the_others() -> None:
    page = _page(_cache_info("nan", "0.9"), "vllm")
    assert engines.page_settings(page, "vllm") == ({"gpu_memory_utilization": 0.9}, 1)


@pytest.mark.parametrize("label", ["None", "", "-1", "0"])
def test_not_set_is_absent_and_not_counted(label: str) -> None:
    assert engines.page_settings(_page(_cache_info(label), "vllm"), "vllm") == ({}, 0)


def test_a_page_without_the_info_gauge_tells_nothing() -> None:
    text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1\n'
    assert engines.page_settings(_page(text, "vllm"), "vllm") == ({}, 0)


@pytest.mark.parametrize(
    ("raw", "setting", "expected"),
    [
        (8192, "max_model_len", 8192.0),
        (8192.0, "max_model_len", 8192.0),
        ("8192", "max_model_len", 8192.0),
        ("1e3", "max_num_seqs", 1000.0),
        (0.9, "gpu_memory_utilization", 0.9),
        (1, "gpu_memory_utilization", 1.0),
        (None, "max_model_len", None),
        (-1, "max_num_batched_tokens", None),
        (0, "max_num_seqs", None),
    ],
)
def test_value(raw: object, setting: str, expected: float | None) -> None:
    assert settings.value(raw, setting) == expected


@pytest.mark.parametrize(
    ("raw", "setting"),
    [
        (True, "max_num_seqs"),
        (8.5, "max_num_seqs"),
        (1.01, "gpu_memory_utilization"),
        (float("inf"), "max_model_len"),
        (float("nan"), "max_model_len"),
        ({"n": 1}, "max_model_len"),
        ([8], "max_model_len"),
        ("8k", "max_model_len"),
    ],
)
def test_garbage_value(raw: object, setting: str) -> None:
    with pytest.raises(settings.Garbage):
        settings.value(raw, setting)


def _read(engine: str, routes: Mapping[str, object]) -> tuple[dict[str, float], int]:
    """engines.read_settings against an engine answering ``routes`` (path -> JSON document,
    an httpx.Response, or an exception to raise)."""

    def handler(request: httpx.Request) -> httpx.Response:
        answer = routes.get(request.url.path, httpx.Response(404, text="Not Found"))
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        return httpx.Response(200, json=answer)

    async def go() -> tuple[dict[str, float], int]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await engines.read_settings(client, "http://engine:8000", engine)

    return asyncio.run(go())


VLLM_MODELS = {
    "object": "list",
    "data": [{"id": "m", "object": "model", "max_model_len": 131072, "owned_by": "vllm"}],
}


@pytest.mark.parametrize(
    ("engine", "routes", "expected"),
    [
        ("vllm", {"/v1/models": VLLM_MODELS}, {"max_model_len": 131072.0}),
        (
            "llamacpp",
            {"/props": {"total_slots": 4, "default_generation_settings": {"n_ctx": 4096},
                        "build_info": "b7000"}},
            {"max_num_seqs": 4.0, "max_model_len": 4096.0},
        ),
        (
            "tgi",
            {"/info": {"model_id": "m", "max_concurrent_requests": 128, "max_total_tokens": 4096,
                       "max_input_tokens": 4095, "version": "3.3.0"}},
            {"max_num_seqs": 128.0, "max_model_len": 4096.0},
        ),
        (
            "sglang",
            {"/get_server_info": {"mem_fraction_static": 0.88, "max_running_requests": None,
                                  "chunked_prefill_size": 8192, "context_length": None}},
            {"gpu_memory_utilization": 0.88, "max_num_batched_tokens": 8192.0},
        ),
        ("sglang", {"/get_server_info": {"chunked_prefill_size": -1}}, {}),
        ("triton", {}, {}),
    ],
)  # fmt: skip
def test_endpoints_tell(engine: str, routes: dict[str, object], expected: dict[str, float]) -> None:
    assert _read(engine, routes) == (expected, 0)


def test_garbage_fields_are_left_out_and_counted() -> None:
    body = b'{"total_slots": "four", "default_generation_settings": {"n_ctx": 1e400}}'
    assert _read("llamacpp", {"/props": httpx.Response(200, content=body)}) == ({}, 2)
    document = {"total_slots": True, "default_generation_settings": {"n_ctx": 4096.5}}
    assert _read("llamacpp", {"/props": document}) == ({}, 2)


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(500),
        httpx.Response(200, text="<html>"),
        httpx.Response(200, json=["not", "an", "object"]),
        httpx.Response(200, content=b"[" * 100_000),
        httpx.Response(200, content=json.dumps({"data": "x" * 70_000}).encode()),
        httpx.ConnectError("refused"),
    ],
)
def test_an_endpoint_that_does_not_answer_tells_nothing(answer: Any) -> None:
    assert _read("vllm", {"/v1/models": answer}) == ({}, 0)


def test_the_sidecar_serves_the_settings_and_counts_garbage() -> None:
    """One series per setting, labelled with the model the page names; the page's label and
    the endpoint's field together; a garbage label counted as a dropped series; an endpoint
    that fails a read keeps what it told last."""
    pages = iter([_cache_info("0.9"), _cache_info("nan")])
    current: dict[str, Any] = {"page": "", "models": httpx.Response(200, json=VLLM_MODELS)}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=current["page"])
        if request.url.path == "/v1/models":
            answer: httpx.Response = current["models"]
            return answer
        return httpx.Response(404)

    async def scrape() -> tuple[list[Any], list[Any], list[Any]]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        engine = EngineCollector(
            EngineScraper("http://engine:8000/metrics", timeout_s=2.0, client=client), {}
        )
        try:
            current["page"] = next(pages)
            await engine.collect()
            assert engine._settings_task is not None
            await engine._settings_task
            first = list(await engine.collect())
            current["page"] = next(pages)
            current["models"] = httpx.Response(503)
            engine._settings_read_at = -math.inf  # the next read is due
            await engine.collect()
            await engine._settings_task
            second = list(await engine.collect())
            return first, second, engine.status_families()
        finally:
            await engine.aclose()

    first, second, status = asyncio.run(scrape())

    def told(families: list[Any]) -> dict[str, float]:
        found = {}
        for family in families:
            for sample in family.samples:
                if sample.name == "inferwatch_engine_setting":
                    assert sample.labels["model"] == "m" and sample.labels["engine"] == "vllm"
                    found[sample.labels["setting"]] = sample.value
        return found

    assert told(first) == {"gpu_memory_utilization": 0.9, "max_model_len": 131072.0}
    assert told(second) == {"max_model_len": 131072.0}
    dropped = {
        s.labels["reason"]: s.value
        for f in status
        for s in f.samples
        if s.name == "inferwatch_engine_scrape_dropped_series_total"
    }
    assert dropped == {BAD_SETTING: 2}  # the second page's, scraped twice


def test_garbage_from_the_endpoint_and_from_the_page_both_count() -> None:
    """The endpoint's garbage is counted on the event loop, the page's in the worker thread:
    two counts, one series."""
    models = {"data": [{"id": "m", "max_model_len": "four"}]}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=_cache_info("nan"))
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=models)
        return httpx.Response(404)

    async def scrape() -> list[Any]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        engine = EngineCollector(
            EngineScraper("http://engine:8000/metrics", timeout_s=2.0, client=client), {}
        )
        try:
            await engine.collect()
            assert engine._settings_task is not None
            await engine._settings_task
            await engine.collect()
            return engine.status_families()
        finally:
            await engine.aclose()

    dropped = [
        s.value
        for f in asyncio.run(scrape())
        for s in f.samples
        if s.name == "inferwatch_engine_scrape_dropped_series_total"
        and s.labels["reason"] == BAD_SETTING
    ]
    assert dropped == [3]  # the page's twice, the endpoint's once
