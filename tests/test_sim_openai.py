"""The simulator's OpenAI surface, driven by the official ``openai`` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.sim.answers import prompt_key
from inferwatch.sim.server import SimHandle, run_in_thread, start_subprocess
from inferwatch.sim.simulator import SimConfig
from support.wait import wait_for

pytestmark = pytest.mark.proc

REPO = Path(__file__).resolve().parent.parent
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FRANCE = "What is the capital of France? Reply with the city name only."


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with run_in_thread(SimConfig(port=0, speed=50)) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(sim: SimHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def shipped_goldens() -> list[dict[str, Any]]:
    probes = []
    for path in sorted((REPO / "probes" / "goldens").glob("*.yaml")):
        probes += yaml.safe_load(path.read_text(encoding="utf-8"))["probes"]
    return probes


def test_chat_answer_and_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": FRANCE}], max_tokens=16
    )
    assert reply.choices[0].message.content == "Paris"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 2  # "Paris" and the end-of-sequence token
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 2


def test_chat_stream_with_usage_ends_with_a_usage_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about batching."}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 12
    text = "".join(c.choices[0].delta.content or "" for c in body)
    assert len(text.split()) >= 8
    assert body[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in body)


def test_stream_without_include_usage_has_no_usage_chunk(sim: SimHandle) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": FRANCE}], "stream": True}
    with httpx.stream("POST", sim.url + "/v1/chat/completions", json=body, timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in events[:-1]]
    assert all(p["choices"] for p in payloads)
    assert "".join(p["choices"][0]["delta"].get("content", "") for p in payloads) == "Paris"


def test_completions_stream_and_not(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 5
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    )


def test_same_prompt_same_answer(client: openai.OpenAI) -> None:
    def ask() -> str | None:
        messages = [{"role": "user", "content": "Describe a healthy replica."}]
        reply = client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        return reply.choices[0].message.content

    assert ask() == ask()


def test_every_shipped_golden_gets_its_canonical_answer(client: openai.OpenAI) -> None:
    probes = shipped_goldens()
    assert probes, "probes/goldens/*.yaml is empty"
    for probe in probes:
        messages = probe.get("messages") or [{"role": "user", "content": probe["prompt"]}]
        kwargs: dict[str, Any] = {"max_tokens": probe.get("max_tokens", 64)}
        if probe.get("tools"):
            kwargs["tools"] = probe["tools"]
        reply = client.chat.completions.create(model=MODEL, messages=messages, **kwargs)
        choice = reply.choices[0]
        if "tool_call" in probe:
            assert choice.finish_reason == "tool_calls", probe["id"]
            call = choice.message.tool_calls[0]  # type: ignore[index]
            assert call.function.name == probe["tool_call"]["name"]  # type: ignore[union-attr]
            assert json.loads(call.function.arguments) == probe["tool_call"]["arguments"]  # type: ignore[union-attr]
        else:
            assert choice.message.content == str(probe["answer"]), probe["id"]
            assert choice.finish_reason == "stop", probe["id"]


def test_tool_call_streams_in_openai_deltas(client: openai.OpenAI) -> None:
    probe = next(p for p in shipped_goldens() if "tool_call" in p)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": probe["prompt"]}],
        tools=probe["tools"],
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    calls = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert (
        calls[0].id and calls[0].function and calls[0].function.name == probe["tool_call"]["name"]
    )
    arguments = "".join(d.function.arguments or "" for d in calls if d.function)
    assert json.loads(arguments) == probe["tool_call"]["arguments"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_goldens_from_another_folder(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "mine",
                "probes": [
                    {"id": "colour", "prompt": "Name  the colour\nof grass.", "answer": "green"},
                    {
                        "id": "chat",
                        "messages": [
                            {"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Two plus two?"},
                        ],
                        "answer": "4",
                    },
                ],
            }
        )
    )
    with run_in_thread(SimConfig(port=0, speed=50, goldens=tmp_path)) as handle:
        assert len(handle.simulator.book) == 2
        with openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0) as c:
            grass = [{"role": "user", "content": "Name the colour of grass."}]
            reply = c.chat.completions.create(model=MODEL, messages=grass)  # type: ignore[arg-type]
            assert reply.choices[0].message.content == "green"
            sums = [{"role": "user", "content": "Two plus two?"}]
            reply = c.chat.completions.create(model=MODEL, messages=sums)  # type: ignore[arg-type]
            assert reply.choices[0].message.content == "4"
    assert prompt_key("Name  the colour\nof grass.") == "Name the colour of grass."


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_request_longer_than_max_model_len_is_400() -> None:
    with (
        run_in_thread(SimConfig(port=0, speed=50, max_model_len=64)) as handle,
        openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0) as c,
        pytest.raises(openai.BadRequestError, match="maximum context length is 64 tokens"),
    ):
        c.completions.create(model=MODEL, prompt="word " * 80, max_tokens=4)


def test_bad_bodies_are_400(sim: SimHandle) -> None:
    url = sim.url + "/v1/chat/completions"
    assert httpx.post(url, content=b"{not json").status_code == 400
    assert httpx.post(url, json={"model": MODEL, "messages": []}).status_code == 400
    reply = httpx.post(url, json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                  "max_tokens": 0})  # fmt: skip
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "BadRequestError"


def test_models_health_and_version(client: openai.OpenAI, sim: SimHandle) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(sim.url + "/health").status_code == 200
    assert httpx.get(sim.url + "/version").json() == {"version": "0.33.0"}


def test_several_served_names_are_answered_and_the_first_is_reported() -> None:
    # as vLLM's --served-model-name a b: a fallback replica answers the name clients ask for
    names = ("Qwen/Qwen2.5-7B-Instruct", MODEL)
    with (
        run_in_thread(SimConfig(port=0, speed=50, served_model_names=names)) as handle,
        openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0) as c,
    ):
        replies = [c.completions.create(model=name, prompt="hi", max_tokens=2) for name in names]
        assert [m.id for m in c.models.list().data] == list(names)
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
        metrics = httpx.get(handle.url + "/metrics").text
    assert [reply.model for reply in replies] == [names[0], names[0]]
    assert f'model_name="{names[0]}"' in metrics and f'model_name="{MODEL}"' not in metrics


def test_subprocess_serves_and_stops() -> None:
    with start_subprocess(["--speed", "50", "--served-model-name", "tiny"]) as proc:
        reply = httpx.post(
            proc.url + "/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 3},
            timeout=10,
        )
        assert reply.json()["usage"]["completion_tokens"] == 3
    assert proc.process.returncode is not None


def test_client_disconnect_aborts_the_request() -> None:
    # real-time decoding: 2000 tokens take seconds, far longer than the client takes to leave
    # however busy the machine (at 50x the request could end before the disconnect is seen)
    with run_in_thread(SimConfig(port=0, speed=1)) as sim:

        def sample(name: str, **labels: str) -> float:
            text = httpx.get(sim.url + "/metrics").text
            found = [s for f in text_string_to_metric_families(text) for s in f.samples
                     if s.name == name and labels.items() <= s.labels.items()]  # fmt: skip
            return sum(s.value for s in found)

        body = {"model": MODEL, "prompt": "a long story", "max_tokens": 2000, "stream": True,
                "ignore_eos": True}  # fmt: skip
        with httpx.stream("POST", sim.url + "/v1/completions", json=body, timeout=10) as reply:
            assert next(reply.iter_lines()).startswith("data: {")
        wait_for(
            lambda: sample("vllm:request_success_total", finished_reason="abort"),
            "the engine to see the disconnect",
            10,
            interval=0.05,
        )
        assert sample("vllm:request_success_total", finished_reason="abort") == 1
        assert sample("vllm:request_success_total", finished_reason="length") == 0
        assert sample("vllm:num_requests_running") == 0
