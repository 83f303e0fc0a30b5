"""Fault injection: each fault is visible from outside, in the API and in the metrics it moves."""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.cli import main
from inferwatch.demo.signals import Scrape, quantiles
from inferwatch.sim.server import SimHandle, run_in_thread, start_subprocess
from inferwatch.sim.simulator import SimConfig
from support.wait import wait_for

pytestmark = pytest.mark.proc

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def value(text: str, name: str, **labels: str) -> float:
    # a counter family not ending in _total (DCGM) is parsed with "_total" added to its samples
    found = [s.value for f in text_string_to_metric_families(text) for s in f.samples
             if name in (s.name, f.name) and labels.items() <= s.labels.items()]  # fmt: skip
    assert found, f"no {name} {labels}"
    return sum(found)


def chat(url: str, content: str, max_tokens: int = 16, timeout: float = 30) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def metrics(handle: SimHandle) -> str:
    return httpx.get(handle.url + "/metrics").text


def inject(handle: SimHandle, document: dict[str, Any]) -> httpx.Response:
    return httpx.post(handle.url + "/admin/faults", json=document, headers=AUTH)


@pytest.fixture
def sim() -> Iterator[SimHandle]:
    with run_in_thread(SimConfig(port=0, speed=20, admin_token=TOKEN)) as handle:
        yield handle


def test_admin_endpoint_needs_the_bearer_token(sim: SimHandle) -> None:
    url = sim.url + "/admin/faults"
    missing = httpx.post(url, json={"hang": True})
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert (
        httpx.post(url, json={"hang": True}, headers={"Authorization": "Bearer nope"}).status_code
        == 401
    )
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers=AUTH).json()["hang"] is False  # nothing changed
    with run_in_thread(SimConfig(port=0)) as closed:
        assert httpx.get(closed.url + "/admin/faults", headers=AUTH).status_code == 403


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"explode": True}, "unknown fault 'explode'"),
        ({"error_rate": 2}, "error_rate must be between 0 and 1"),
        ({"degenerate": "shouting"}, "degenerate must be one of"),
        ({"degenerate": {"mode": "empty", "min_tokens": 1.5}}, "min_tokens must be a whole"),
        ({"gpu": [{"index": 9, "xid": 79}]}, "index must be between 0 and 0"),
    ],
)
def test_bad_fault_documents_are_400(
    sim: SimHandle, document: dict[str, Any], message: str
) -> None:
    reply = inject(sim, document)
    assert reply.status_code == 400
    assert message in reply.json()["error"]["message"]


def test_slow_steps_stretch_inter_token_latency(sim: SimHandle) -> None:
    def median_itl(run: str) -> float:
        """Median simulated inter-token interval of one request: a host stall (a busy
        machine) stretches a few intervals, which moves a mean but not the median."""
        before = Scrape.parse(0, metrics(sim))
        assert chat(sim.url, run, max_tokens=30).status_code == 200
        after = Scrape.parse(1, metrics(sim))
        (median,) = quantiles(before, after, "vllm:inter_token_latency_seconds", (0.5,))
        assert median is not None
        return median

    normal = median_itl("a normal run")
    assert inject(sim, {"slow_factor": 10}).json()["slow_factor"] == 10
    slow = median_itl("a slow run")
    assert slow > 5 * normal


def test_error_rate_answers_500_and_counts_errors(sim: SimHandle) -> None:
    inject(sim, {"error_rate": 1.0})
    before = metrics(sim)
    reply = chat(sim.url, "will fail")
    assert reply.status_code == 500
    assert reply.json()["error"]["type"] == "InternalServerError"
    after = metrics(sim)
    assert value(after, "vllm:request_success_total", finished_reason="error") == 1
    assert value(after, "http_requests_total", status="5xx") == 1
    assert value(after, "vllm:prompt_tokens_total") == value(before, "vllm:prompt_tokens_total")


@pytest.mark.parametrize(
    ("mode", "check"),
    [
        (
            "repetition",
            lambda text, usage: len(set(text.split())) == 1 and usage["completion_tokens"] == 24,
        ),
        ("empty", lambda text, usage: text == "" and usage["completion_tokens"] == 1),
        ("wrong_script", lambda text, usage: re.search("[\u0400-\u04ff]", text) is not None),
        ("wrong_answer", lambda text, usage: text == "43"),
    ],
)
def test_degenerate_output(sim: SimHandle, mode: str, check: Any) -> None:
    question = "What is 17 + 25? Reply with the number only."
    assert chat(sim.url, question).json()["choices"][0]["message"]["content"] == "42"
    inject(sim, {"degenerate": mode})
    before = metrics(sim)
    reply = chat(sim.url, question, max_tokens=24).json()
    assert check(reply["choices"][0]["message"]["content"], reply["usage"]), reply
    after = metrics(sim)
    generated = value(after, "vllm:request_generation_tokens_sum") - value(
        before, "vllm:request_generation_tokens_sum"
    )
    assert generated == reply["usage"]["completion_tokens"]
    reason = "length" if mode == "repetition" else "stop"
    assert (
        value(after, "vllm:request_success_total", finished_reason=reason)
        == value(before, "vllm:request_success_total", finished_reason=reason) + 1
    )


def test_a_degenerate_fault_with_min_tokens_spares_shorter_requests(sim: SimHandle) -> None:
    """A loop that only long generations fall into: short golden probes still pass."""
    question = "What is 17 + 25? Reply with the number only."
    inject(sim, {"degenerate": {"mode": "repetition", "min_tokens": 96}})
    short = chat(sim.url, question, max_tokens=95).json()["choices"][0]["message"]["content"]
    long = chat(sim.url, question, max_tokens=96).json()
    assert short == "42"
    assert long["usage"]["completion_tokens"] == 96, long
    assert len(set(long["choices"][0]["message"]["content"].split())) == 1, long


def test_xid_kills_the_engine_until_reset(sim: SimHandle) -> None:
    assert inject(sim, {"gpu": [{"index": 0, "xid": 79}]}).json()["dead_engines"] == [0]
    gpu = httpx.get(sim.url + "/gpu/metrics").text
    assert (
        value(gpu, "DCGM_FI_DEV_XID_ERRORS", err_code="79", err_msg="GPU has fallen off the bus")
        == 79
    )
    assert httpx.get(sim.url + "/health").status_code == 503
    assert chat(sim.url, "anyone there?").status_code == 500
    assert value(metrics(sim), "vllm:request_success_total", finished_reason="error") == 1
    assert httpx.delete(sim.url + "/admin/faults", headers=AUTH).json()["dead_engines"] == []
    assert value(httpx.get(sim.url + "/gpu/metrics").text, "DCGM_FI_DEV_XID_ERRORS") == 0
    assert httpx.get(sim.url + "/health").status_code == 200
    assert chat(sim.url, "back?").status_code == 200


def test_non_fatal_xid_leaves_the_engine_serving(sim: SimHandle) -> None:
    inject(sim, {"gpu": [{"xid": 63}]})
    assert value(httpx.get(sim.url + "/gpu/metrics").text, "DCGM_FI_DEV_XID_ERRORS") == 63
    assert chat(sim.url, "still here?").status_code == 200


def test_ecc_and_row_remap_counters(sim: SimHandle) -> None:
    inject(sim, {"gpu": [{"index": 0, "ecc_sbe": 10, "ecc_dbe": 1}]})
    inject(sim, {"gpu": [{"index": 0, "ecc_dbe": 1, "remapped_uncorrectable": 2,
                          "remap_pending": True, "remap_failure": True}]})  # fmt: skip
    gpu = httpx.get(sim.url + "/gpu/metrics").text
    assert value(gpu, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL") == 10
    assert value(gpu, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 2
    assert value(gpu, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == 2
    assert value(gpu, "DCGM_FI_DEV_ROW_REMAP_PENDING") == 1
    assert value(gpu, "DCGM_FI_DEV_ROW_REMAP_FAILURE") == 1
    httpx.delete(sim.url + "/admin/faults", headers=AUTH)
    cleared = httpx.get(sim.url + "/gpu/metrics").text
    assert value(cleared, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0
    assert value(cleared, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == 0
    assert value(cleared, "DCGM_FI_DEV_ROW_REMAP_FAILURE") == 0


def test_kv_exhaustion_preempts_and_saturates_the_cache() -> None:
    config = SimConfig(port=0, speed=20, admin_token=TOKEN, num_gpu_blocks=64)
    with run_in_thread(config) as handle:
        inject(handle, {"kv_exhaustion": 0.9})  # 57 of 64 blocks withheld: 112 tokens left
        assert value(metrics(handle), "vllm:kv_cache_usage_perc") == 57 / 64
        # held until all four are queued, so they run together however the threads start
        inject(handle, {"hang": True})
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            pending = pool.map(lambda i: chat(handle.url, f"req {i} " + "word " * 8, 40), range(4))
            wait_for(
                lambda: value(metrics(handle), "vllm:num_requests_waiting") >= 4,
                "the four requests to queue",
                20,
                interval=0.01,
            )
            inject(handle, {"hang": False})
            replies = list(pending)
        assert all(r.status_code == 200 for r in replies)
        assert all(r.json()["usage"]["completion_tokens"] == 40 for r in replies)
        text = metrics(handle)
    assert value(text, "vllm:num_preemptions_total") > 0
    assert value(text, "vllm:request_num_preemptions_sum") > 0
    assert value(text, "vllm:request_queue_time_seconds_sum") > 0


def test_hang_stops_progress_and_fails_health(sim: SimHandle) -> None:
    inject(sim, {"hang": True})
    assert httpx.get(sim.url + "/health").status_code == 503
    with pytest.raises(httpx.ReadTimeout):
        chat(sim.url, "are you stuck?", timeout=0.5)
    stuck = metrics(sim)
    assert value(stuck, "vllm:num_requests_waiting") == 1
    assert value(stuck, "vllm:generation_tokens_total") == 0
    httpx.delete(sim.url + "/admin/faults", headers=AUTH)
    assert httpx.get(sim.url + "/health").status_code == 200
    assert chat(sim.url, "unstuck?").status_code == 200


def test_faults_from_a_file_at_start_up(tmp_path: Path) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text("error_rate: 1.0\ngpu:\n  - {index: 0, ecc_dbe: 3}\n")
    with start_subprocess(["--speed", "50", "--faults", str(path)]) as proc:
        assert chat(proc.url, "hello").status_code == 500
        assert value(httpx.get(proc.gpu_url).text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 3


def test_bad_fault_file_is_a_clear_cli_error(tmp_path: Path) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text("slow_factor: fast\n")
    result = CliRunner().invoke(main, ["sim", "--port", "0", "--faults", str(path)])
    assert result.exit_code == 2
    assert (
        result.output.strip().splitlines()[-1] == "Error: slow_factor must be a number, not 'fast'"
    )
    assert "Traceback" not in result.output
