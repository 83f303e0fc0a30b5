"""``inferwatch canary`` against a real Prometheus holding a realistic half hour of a fleet.

The engine series are shaped by a real ``inferwatch sidecar`` serving the vLLM 0.33.0
capture: its page gives the TTFT and TPOT histograms' bucket bounds as the sidecar spells
them and the identity labels it adds; the proxy's and the probe runner's series follow the
catalogue. Every replica is scraped every 15 s over half an hour: a baseline of two replicas
and four candidates of one replica each.
Latencies are drawn from log-normal distributions, errors, probe failures and degenerate
outputs from Bernoulli trials, with a fixed seed. ``promtool tsdb create-blocks-from
openmetrics`` writes the blocks a real Prometheus then serves, and the real CLI decides:
the healthy candidate promotes, the slow one and the one that degenerates at a low rate
roll back, the one with a trickle of traffic is inconclusive.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from inferwatch import catalog
from inferwatch.serving import textformat
from support.ports import announced_url, launch
from support.shared import REPO, shared_path
from support.wait import wait_for

pytestmark = pytest.mark.e2e

INFERWATCH = Path(sys.executable).parent / "inferwatch"
CAPTURE = shared_path("fixtures/engines/vllm-generated-0.33.0-1engine.prom")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
STEP_S, MINUTES = 15, 30
#: price per token (prompt, completion) of the proxy's price table
PRICES = (0.2e-6, 0.6e-6)
SIGNALS = ("empty", "repetition", "wrong_script")


@dataclass(frozen=True)
class Version:
    name: str
    replicas: int
    requests_per_step: float  # per replica
    ttft_median_s: float = 0.15
    tpot_median_s: float = 0.02
    error_p: float = 0.002
    repetition_p: float = 0.002
    probe_fail_p: float = 0.02


VERSIONS = (
    Version("2024-07-23", replicas=2, requests_per_step=4),
    Version("healthy", replicas=1, requests_per_step=4),
    Version("slow", replicas=1, requests_per_step=4, ttft_median_s=0.3),
    Version("degenerate", replicas=1, requests_per_step=4, repetition_p=0.03),
    Version("quiet", replicas=1, requests_per_step=0.15),
)


@dataclass(frozen=True)
class Template:
    """What a real sidecar's page fixes: bucket bounds (as it spells them), identity labels."""

    ttft: list[str]
    tpot: list[str]
    engine_labels: frozenset[str]


def sidecar_template(work: Path) -> Template:
    """One real sidecar in front of the vLLM capture; its /metrics after a scrape."""
    from support.pages import PageServer

    pages = PageServer()
    threading.Thread(target=pages.serve_forever, args=(0.05,), daemon=True).start()
    engine = f"{pages.url}/fixture/{CAPTURE.name.removesuffix('.prom')}/metrics"
    args = [
        str(INFERWATCH), "sidecar", f"--engine-url={engine}", "--listen=127.0.0.1:0",
        "--gpu=none", "--pod=template", "--namespace=inference", "--node=node-1",
        f"--model={MODEL}", "--model-version=template", "--prompt-version=p1",
    ]  # fmt: skip
    log = work / "sidecar.log"
    with log.open("w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    ttft_name = catalog.load()["engine_time_to_first_token"].name
    try:
        url = announced_url(process, log, "the template sidecar") + "/metrics"
        wait_for(lambda: ttft_name in httpx.get(url, timeout=5).text, "the sidecar's scrape", 120)
        page = textformat.parse(httpx.get(url, timeout=5).text)
    finally:
        process.terminate()
        process.wait(timeout=30)
        pages.shutdown()
        pages.server_close()

    def bounds(key: str) -> list[str]:
        samples = page.families[catalog.load()[key].name].samples
        return list(dict.fromkeys(x.labels["le"] for x in samples if "le" in x.labels))

    finished = page.families[catalog.load()["engine_requests_finished"].name].samples[0]
    return Template(
        bounds("engine_time_to_first_token"),
        bounds("engine_time_per_output_token"),
        frozenset(finished.labels) - {"reason"},
    )


class _Replica:
    """Cumulative counters of one replica, advanced one scrape at a time."""

    def __init__(self, version: Version, pod: str, template: Template) -> None:
        self.version, self.pod, self.template = version, pod, template
        self.ttft_bounds = [float(le) for le in template.ttft]
        self.tpot_bounds = [float(le) for le in template.tpot]
        self.ttft, self.tpot = [0] * len(self.ttft_bounds), [0] * len(self.tpot_bounds)
        self.sums = [0.0, 0.0]
        self.finished = self.errors = 0
        self.probes = {"pass": 0, "fail": 0}
        self.sampled = 0
        self.degenerate = dict.fromkeys(SIGNALS, 0)
        self.tokens = [0, 0]
        self.cost = 0.0

    @staticmethod
    def _observe(counts: list[int], bounds: list[float], value: float) -> None:
        for index, bound in enumerate(bounds):
            if value <= bound:
                counts[index] += 1

    def step(self, rng: random.Random, probe_due: bool) -> None:
        v = self.version
        arrivals = int(v.requests_per_step) + (rng.random() < v.requests_per_step % 1)
        for _ in range(arrivals):
            if rng.random() < v.error_p:
                self.errors += 1
                continue
            self.finished += 1
            ttft = rng.lognormvariate(math.log(v.ttft_median_s), 0.5)
            tpot = rng.lognormvariate(math.log(v.tpot_median_s), 0.3)
            self._observe(self.ttft, self.ttft_bounds, ttft)
            self._observe(self.tpot, self.tpot_bounds, tpot)
            self.sums[0] += ttft
            self.sums[1] += tpot
            prompt, completion = rng.randint(200, 1200), rng.randint(50, 400)
            self.tokens[0] += prompt
            self.tokens[1] += completion
            self.cost += prompt * PRICES[0] + completion * PRICES[1]
            if rng.random() < 0.5:  # the proxy's quality_sample_rate
                self.sampled += 1
                self.degenerate["repetition"] += rng.random() < v.repetition_p
        if probe_due:
            for _ in range(5):  # one golden set of five probes a minute
                self.probes["fail" if rng.random() < v.probe_fail_p else "pass"] += 1

    def lines(self, t: float) -> Iterator[str]:
        cat = catalog.load()
        engine = {
            "model": MODEL,
            "model_version": self.version.name,
            "engine": "vllm",
            "engine_version": "0.33.0",
            "prompt_version": "p1",
            "pod": self.pod,
            "namespace": "inference",
            "node": "node-1",
        }
        assert set(engine) == self.template.engine_labels  # the labels the real sidecar adds
        tenant = {
            "tenant": "acme",
            "model": MODEL,
            "model_version": self.version.name,
            "engine_version": "0.33.0",
            "prompt_version": "p1",
            "split": "weight",
        }
        probe = {
            "target": self.pod,
            "route": "direct",
            "model": MODEL,
            "model_version": self.version.name,
            "set": "smoke",
            "probe": "capital",
        }
        quality = {"model": MODEL, "model_version": self.version.name}

        target = {"instance": f"{self.pod}:9400", "job": "inference/llama"}  # scrape's labels

        def line(key: str, labels: dict[str, str], value: float, suffix: str = "") -> str:
            text = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, **target}.items()))
            return f"{cat[key].name}{suffix}{{{text}}} {value:.9g} {t:.3f}\n"

        for key, counts, spelt, total in (
            ("engine_time_to_first_token", self.ttft, self.template.ttft, self.sums[0]),
            ("engine_time_per_output_token", self.tpot, self.template.tpot, self.sums[1]),
        ):
            for le, count in zip(spelt, counts, strict=True):
                yield line(key, {**engine, "le": le}, count, "_bucket")
            yield line(key, engine, counts[-1], "_count")
            yield line(key, engine, total, "_sum")
        yield line("engine_requests_finished", {**engine, "reason": "stop"}, self.finished)
        yield line("engine_request_errors", {**engine, "reason": "error"}, self.errors)
        for result, count in self.probes.items():
            yield line("probe_runs", {**probe, "result": result}, count)
        yield line("quality_sampled_outputs", quality, self.sampled)
        for signal, count in self.degenerate.items():
            yield line("quality_degenerate_outputs", {**quality, "signal": signal}, count)
        for token_type, count in zip(("prompt", "completion"), self.tokens, strict=True):
            yield line(
                "tenancy_tokens",
                {**tenant, "token_type": token_type, "usage_source": "reported"},
                count,
            )
        yield line("tenancy_cost", {**tenant, "usage_source": "reported"}, self.cost)


def write_fleet(out: Path, end: float, template: Template) -> None:
    rng = random.Random(17)
    replicas = [
        _Replica(v, f"llama-{v.name}-{i}", template) for v in VERSIONS for i in range(v.replicas)
    ]
    steps = MINUTES * 60 // STEP_S
    with out.open("w", encoding="utf-8") as handle:
        for step in range(steps + 1):
            t = end - (steps - step) * STEP_S
            for replica in replicas:
                if step:
                    replica.step(rng, probe_due=step % 4 == 0)
                handle.writelines(replica.lines(t))
        handle.write("# EOF\n")


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, promtool: str, prometheus_bin: str
) -> Iterator[tuple[str, float]]:
    if not CAPTURE.exists():
        pytest.skip(f"shared fixture {CAPTURE} not found")
    work = tmp_path_factory.mktemp("canary")
    end = float(int(time.time()) - 60)
    source, data = work / "fleet.om", work / "data"
    write_fleet(source, end, sidecar_template(work))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    (work / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    process, url = launch(
        lambda port: [
            prometheus_bin, f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=30d",
        ],
        work / "prometheus.log",
        "/-/ready",
        "Prometheus",
        timeout=120,
    )  # fmt: skip
    try:
        yield url, end
    finally:
        process.terminate()
        process.wait(timeout=30)


def canary(
    prometheus: tuple[str, float], candidate: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    url, end = prometheus
    return subprocess.run(
        [str(INFERWATCH), "canary", f"--prometheus={url}", '--baseline=model_version="2024-07-23"',
         f'--candidate=model_version="{candidate}"', "--window=30m", f"--at={end}", *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _row(output: str, title: str) -> str:
    return next(line for line in output.splitlines() if title in line)


def test_healthy_candidate_promotes(prometheus: tuple[str, float]) -> None:
    result = canary(prometheus, "healthy")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verdict: promote" in result.stdout
    for title in (
        "TTFT p99",
        "TPOT p99",
        "error ratio",
        "probe pass rate",
        "live degeneracy",
        "cost per 1k",
    ):
        assert "pass" in _row(result.stdout, title), title


def test_slower_candidate_rolls_back_on_ttft(prometheus: tuple[str, float]) -> None:
    result = canary(prometheus, "slow")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "fail" in _row(result.stdout, "TTFT p99")
    assert "pass" in _row(result.stdout, "TPOT p99")
    assert "verdict: roll back" in result.stdout


def test_candidate_degenerating_at_a_low_rate_rolls_back(prometheus: tuple[str, float]) -> None:
    result = canary(prometheus, "degenerate")
    assert result.returncode == 1, result.stdout + result.stderr
    row = _row(result.stdout, "live degeneracy")
    assert "fail" in row and "repetition" in row
    assert "pass" in _row(result.stdout, "TTFT p99")


def test_candidate_with_a_trickle_of_traffic_is_inconclusive(prometheus: tuple[str, float]) -> None:
    result = canary(prometheus, "quiet")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no data" in _row(result.stdout, "TTFT p99")
    assert "verdict: inconclusive" in result.stdout


def test_engine_version_canary_skips_series_without_that_label(
    prometheus: tuple[str, float],
) -> None:
    """Probe and degeneracy series carry no engine_version: n/a, not a missing sample."""
    url, end = prometheus
    result = subprocess.run(
        [str(INFERWATCH), "canary", f"--prometheus={url}", '--baseline=engine_version="0.33.0"',
         '--candidate=engine_version="0.34.0"', f"--at={end}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "n/a" in _row(result.stdout, "probe pass rate")
    assert "no data" in _row(result.stdout, "TTFT p99")


def test_a_query_prometheus_refuses_is_one_line_and_exit_3(prometheus: tuple[str, float]) -> None:
    result = canary(prometheus, "healthy", "--window=1m")
    assert result.returncode in (0, 1, 2)  # a short window is a valid question
    refused = canary(prometheus, 'x",model_version=~"(')
    assert refused.returncode == 3
    assert refused.stderr.count("\n") == 1 and "Error:" in refused.stderr


def _argo_queries() -> dict[str, str]:
    from inferwatch.canary import templates

    (template,) = [
        d for d in yaml.safe_load_all((REPO / "deploy/canary" / templates.ARGO).read_text()) if d
    ]
    return {m["name"]: m["provider"]["prometheus"]["query"] for m in template["spec"]["metrics"]}


def _flagger_queries() -> dict[str, str]:
    from inferwatch.canary import templates

    documents = yaml.safe_load_all((REPO / "deploy/canary" / templates.FLAGGER).read_text())
    return {
        d["metadata"]["name"].removeprefix("inferwatch-"): d["spec"]["query"]
        for d in documents
        if d
    }


def _score(prometheus: tuple[str, float], query: str) -> float | None:
    url, end = prometheus
    reply = httpx.post(f"{url}/api/v1/query", data={"query": query, "time": str(end)}, timeout=30)
    result = reply.json()["data"]["result"]
    assert len(result) <= 1, query
    return float(result[0]["value"][1]) if result else None


@pytest.mark.parametrize("controller", ["argo", "flagger"])
def test_controller_templates_judge_the_same_fleet_alike(
    prometheus: tuple[str, float], controller: str
) -> None:
    """The committed templates' queries, their placeholders filled in as the controller does:
    a score <= 1 passes, > 1 fails, no sample is inconclusive (too little traffic)."""
    queries = _argo_queries() if controller == "argo" else _flagger_queries()
    assert set(queries) == {
        "ttft-p99",
        "tpot-p99",
        "error-ratio",
        "probe-failures",
        "degeneracy",
        "cost-per-1k",
    }

    def score(metric: str, candidate: str) -> float | None:
        text = queries[metric]
        for placeholder, value in (
            ("{{args.baseline}}", 'model_version="2024-07-23"'),
            ("{{args.candidate}}", f'model_version="{candidate}"'),
            ("{{args.window}}", "30m"),
            ("{{ variables.baseline }}", 'model_version="2024-07-23"'),
            ("{{ variables.candidate }}", f'model_version="{candidate}"'),
            ("{{ interval }}", "30m"),
        ):
            text = text.replace(placeholder, value)
        return _score(prometheus, text)

    for metric in queries:
        healthy = score(metric, "healthy")
        assert healthy is not None and healthy <= 1, (metric, healthy)
    slow = score("ttft-p99", "slow")
    assert slow is not None and slow > 1
    degenerate = score("degeneracy", "degenerate")
    assert degenerate is not None and degenerate > 1
    assert score("ttft-p99", "quiet") is None
    assert score("error-ratio", "quiet") is None
