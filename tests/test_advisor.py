"""``inferwatch advisor``: the advice of ``inferwatch advise`` served as series, each
evaluation counted by outcome, a failed one keeping the last advice, against a Prometheus
that answers fixed values."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from inferwatch.advise import serve
from inferwatch.advise.evaluate import OUTCOMES, Request, objectives
from inferwatch.cli import main
from inferwatch.config import Duration
from inferwatch.exitcodes import ExitCode
from support.advise import MODEL, answering, window
from support.ports import refused_port
from support.stub_prometheus import StubPrometheus, stub_prometheus
from support.wait import wait_for

pytestmark = pytest.mark.unit

REQUEST = Request(MODEL, None, None, 1, objectives(None, None), Duration.of_seconds(60))


@pytest.fixture
def prometheus() -> Iterator[StubPrometheus]:
    with stub_prometheus() as stub:
        yield stub


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def samples(advisor: serve.Advisor) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every served sample by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in advisor.families()
        for s in family.samples
    }


def advised(advisor: serve.Advisor) -> dict[str, float]:
    return {
        dict(labels)["setting"]: value
        for (name, labels), value in samples(advisor).items()
        if name == "inferwatch_advise_setting"
    }


def runs(advisor: serve.Advisor) -> dict[str, float]:
    return {
        dict(labels)["outcome"]: value
        for (name, labels), value in samples(advisor).items()
        if name == "inferwatch_advise_runs_total"
    }


def test_the_served_advice_is_the_command_s(prometheus: StubPrometheus) -> None:
    """One implementation of the rules: the series carry what `advise --json` prints."""
    answering(prometheus, window())
    result = CliRunner().invoke(
        main, ["advise", "--prometheus", prometheus.url, "--model", MODEL, "--window", "1m",
               "--json"],
    )  # fmt: skip
    assert result.exit_code == ExitCode.OK, result.stderr
    printed = {p["setting"]: p["value"] for p in json.loads(result.stdout)["proposals"]}
    clock = Clock()
    advisor = serve.Advisor(prometheus.url, [REQUEST], timeout_s=10, clock=clock)
    assert advisor.evaluate(REQUEST) == "advised"
    replicas = printed.pop("replicas")
    assert advised(advisor) == printed
    served = samples(advisor)
    assert served["inferwatch_advise_replicas", (("model", MODEL),)] == replicas
    assert served["inferwatch_advise_last_success_timestamp_seconds", (("model", MODEL),)] == (
        clock.now
    )
    assert runs(advisor) == {outcome: (outcome == "advised") for outcome in (*OUTCOMES, "internal")}


def test_before_any_advice_only_the_runs_are_served_every_outcome_at_0(
    prometheus: StubPrometheus,
) -> None:
    advisor = serve.Advisor(prometheus.url, [REQUEST], timeout_s=10)
    assert advised(advisor) == {}
    assert runs(advisor) == dict.fromkeys((*OUTCOMES, "internal"), 0)
    assert [name for name, _ in samples(advisor)] == ["inferwatch_advise_runs_total"] * 7


@pytest.mark.parametrize(
    ("seen", "outcome"),
    [
        (window(requests=10), "too_little_traffic"),
        (window(("prompt_tokens",), prompt_tokens=None), "missing_signal"),
    ],
)
def test_a_refusal_is_counted_and_the_last_advice_stays(
    prometheus: StubPrometheus, seen: Any, outcome: str
) -> None:
    clock = Clock()
    advisor = serve.Advisor(prometheus.url, [REQUEST], timeout_s=10, clock=clock)
    answering(prometheus, window())
    advisor.evaluate(REQUEST)
    before, succeeded = advised(advisor), clock.now
    answering(prometheus, seen)
    clock.now += 300
    assert advisor.evaluate(REQUEST) == outcome
    assert advisor.evaluate(REQUEST) == outcome
    assert advised(advisor) == before
    assert runs(advisor)["advised"] == 1 and runs(advisor)[outcome] == 2
    served = samples(advisor)
    assert served["inferwatch_advise_last_success_timestamp_seconds", (("model", MODEL),)] == (
        succeeded
    )


def test_an_slo_no_setting_meets_is_counted(prometheus: StubPrometheus) -> None:
    answering(prometheus, window())
    request = Request(MODEL, None, None, 1, objectives(0.001, None), Duration.of_seconds(60))
    advisor = serve.Advisor(prometheus.url, [request], timeout_s=10)
    assert advisor.evaluate(request) == "no_setting_meets"
    assert advised(advisor) == {}


def test_an_unknown_model_or_gpu_is_bad_input(prometheus: StubPrometheus) -> None:
    answering(prometheus, window())
    for request in (
        Request(MODEL, "not-a-preset", None, 1, objectives(None, None), Duration.of_seconds(60)),
        Request(MODEL, None, "TPU", 1, objectives(None, None), Duration.of_seconds(60)),
    ):
        advisor = serve.Advisor(prometheus.url, [request], timeout_s=10)
        assert advisor.evaluate(request) == "bad_input"


def test_prometheus_away_or_answering_nonsense_is_counted(prometheus: StubPrometheus) -> None:
    prometheus.always(b"<html>oops</html>", status=502)
    advisor = serve.Advisor(prometheus.url, [REQUEST], timeout_s=10)
    assert advisor.evaluate(REQUEST) == "prometheus_error"
    with refused_port() as port:
        away = serve.Advisor(f"http://127.0.0.1:{port}", [REQUEST], timeout_s=5)
        assert away.evaluate(REQUEST) == "prometheus_error"
    assert runs(away)["prometheus_error"] == 1


def test_a_bug_is_counted_as_internal_and_the_other_models_still_advised(
    prometheus: StubPrometheus, monkeypatch: pytest.MonkeyPatch
) -> None:
    answering(prometheus, window())
    broken = Request("broken", None, None, 1, objectives(None, None), Duration.of_seconds(60))
    real = serve.evaluate

    def evaluate(client: Any, request: Request, at: float) -> Any:
        if request.model == "broken":
            client.close()
            raise ZeroDivisionError("a bug")
        return real(client, request, at)

    monkeypatch.setattr(serve, "evaluate", evaluate)
    advisor = serve.Advisor(prometheus.url, [broken, REQUEST], timeout_s=10)
    advisor.evaluate_all()
    assert advisor.last_outcome == {"broken": "internal", MODEL: "advised"}
    assert advisor.passes == 1


def test_the_app_serves_the_advice_and_is_ready_after_the_first_pass(
    prometheus: StubPrometheus,
) -> None:
    answering(prometheus, window())
    advisor = serve.Advisor(prometheus.url, [REQUEST], timeout_s=10)
    with TestClient(serve.app(advisor, every_s=3600)) as client:
        # the first pass runs in the app's worker thread
        wait_for(lambda: advisor.passes, "the first pass over the models", 20)
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert client.get("/healthz").status_code == 200
        text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (seqs,) = [
        s for s in families["inferwatch_advise_setting"].samples
        if s.labels == {"model": MODEL, "setting": "max_num_seqs"}
    ]  # fmt: skip
    assert seqs.value == advised(advisor)["max_num_seqs"]
    assert "inferwatch_advise_runs" in families  # the counter, named without _total


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--prometheus", "ftp://x", "--model", MODEL], "ftp"),
        (["--prometheus", "http://127.0.0.1:9", "--model", "=llama"], "names no model"),
        (["--prometheus", "http://127.0.0.1:9"], "--model"),
        (["--prometheus", "http://127.0.0.1:9", "--model", MODEL, "--model", f"{MODEL}=x"],
         "given twice"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, ["advisor", *args])
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert said in result.stderr
