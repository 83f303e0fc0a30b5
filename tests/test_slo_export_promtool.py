"""The SLIs the exported SLO specs carry give the ratios our recording rules give, on the same
series: ``promtool test rules`` evaluates our generated error-ratio rules beside rules made
from the Sloth, OpenSLO and Pyrra specs (each as its tool records the ratio), with a model
that has its own objective and one that has the default.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.alerts import slo_specs, writer
from inferwatch.mixin import config, recording
from inferwatch.mixin.files import dump

pytestmark = pytest.mark.proc

OWN = "Qwen/Qwen2.5-7B-Instruct"
DEFAULT = "other-model"
WINDOW = "5m"
TTFT = "inferwatch_engine_time_to_first_token_seconds"
#: per model, increases per minute: (ttft count, ttft good, finished, errors, HTTP 5xx)
LOAD = {OWN: (8, 4, 6, 1, 2), DEFAULT: (8, 6, 7, 1, None)}
#: what those give, in thousandths: TTFT 4/8 and 2/8 bad; availability 2/8 (the 5xx are more
#: than the engine's errors) and 1/8
EXPECTED = {"ttft": {OWN: 500, DEFAULT: 250}, "availability": {OWN: 250, DEFAULT: 125}}
IDENTITY = ("cluster", "model", "model_version")


def series(name: str, model: str, per_minute: int, **labels: str) -> dict[str, str]:
    selector = ",".join(
        f'{k}="{v}"'
        for k, v in {"cluster": "c1", "model": model, "model_version": "v1", **labels}.items()
    )
    return {"series": f"{name}{{{selector}}}", "values": f"0+{per_minute}x20"}


def input_series() -> list[dict[str, str]]:
    out = []
    for model, (count, good, finished, errors, http_5xx) in LOAD.items():
        out += [
            series(f"{TTFT}_count", model, count),
            series(f"{TTFT}_bucket", model, good, le="2.5"),
            series("inferwatch_engine_requests_finished_total", model, finished, reason="stop"),
            series("inferwatch_engine_requests_finished_total", model, errors, reason="error"),
            series("inferwatch_engine_request_errors_total", model, errors),
        ]
        if http_5xx is not None:
            out.append(
                series(
                    "inferwatch_engine_http_requests_total",
                    model,
                    http_5xx,
                    status="5xx",
                    handler="/v1/chat/completions",
                )
            )
    return out


def spec_rules(cfg: config.Config) -> list[dict[str, Any]]:
    """Each spec's ratio recorded as its tool records it, one name per tool and SLO."""
    rules = []
    for spec in slo_specs.sloth(cfg)["slos"]:
        events = spec["sli"]["events"]
        error, total = (
            events[k].replace(slo_specs.SLOTH_WINDOW, WINDOW)
            for k in ("error_query", "total_query")
        )
        rules.append(
            {"record": f"sloth:{spec['labels']['slo']}:ratio", "expr": f"({error}) / ({total})"}
        )
    for spec in slo_specs.openslo(cfg):
        ratio = spec["spec"]["indicator"]["spec"]["ratioMetric"]
        bad, total = (ratio[k]["metricSource"]["spec"]["query"] for k in ("bad", "total"))
        slo = "ttft" if spec["metadata"]["name"].startswith("ttft") else "availability"
        rules.append({"record": f"openslo:{slo}:ratio", "expr": f"({bad}) / ({total})"})
    for spec in slo_specs.pyrra(cfg):
        latency = spec["spec"]["indicator"]["latency"]
        by = f"by ({', '.join(latency['grouping'])})"
        total = f"sum {by} (rate({latency['total']['metric']}[{WINDOW}]))"
        good = f"sum {by} (rate({latency['success']['metric']}[{WINDOW}]))"
        rules.append({"record": "pyrra:ttft:ratio", "expr": f"({total} - {good}) / {total}"})
    return rules


def test_the_exported_slis_give_our_recorded_error_ratios(promtool: str, tmp_path: Path) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(
        yaml.safe_dump(
            {"slo": {"ttft": {"models": {OWN: 0.995}}, "availability": {"models": {OWN: 0.9995}}}}
        )
    )
    cfg = config.load(path)
    (tmp_path / "recording.yaml").write_text(writer.render(cfg)["recording.yaml"])
    (tmp_path / "specs.yaml").write_text(
        dump({"groups": [{"name": "specs", "rules": spec_rules(cfg)}]})
    )
    on = f"on ({', '.join(IDENTITY)})"
    tests = []
    for slo, values in EXPECTED.items():
        ours = recording.slo_error_ratio(cfg, slo, WINDOW)
        tools = ["sloth", "openslo"] + (["pyrra"] if slo == "ttft" else [])
        exp = [
            {"labels": f'{{cluster="c1",model="{model}",model_version="v1"}}', "value": value}
            for model, value in sorted(values.items())
        ]
        tests.append(
            {
                "expr": f"round(1000 * sum by ({', '.join(IDENTITY)}) ({ours}))",
                "eval_time": "10m",
                "exp_samples": exp,
            }
        )
        for tool in tools:
            theirs = f"{tool}:{slo}:ratio"
            tests.append(
                {"expr": f"round(1000 * {theirs})", "eval_time": "10m", "exp_samples": exp}
            )
            tests.append(
                {
                    "expr": f"abs({ours} - {on} {theirs}) > 1e-9",
                    "eval_time": "10m",
                    "exp_samples": [],
                }
            )
    (tmp_path / "test.yaml").write_text(
        dump(
            {
                "rule_files": ["recording.yaml", "specs.yaml"],
                "evaluation_interval": "1m",
                "tests": [
                    {"interval": "1m", "input_series": input_series(), "promql_expr_test": tests}
                ],
            }
        )
    )
    result = subprocess.run(
        [promtool, "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
