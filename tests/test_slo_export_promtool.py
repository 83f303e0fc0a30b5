"""The SLIs the exported SLO specs carry give the ratios our recording rules give, on the same
series: ``promtool test rules`` evaluates our generated error-ratio rules beside rules made
from the Sloth, OpenSLO and Pyrra specs (each as its tool records the ratio), with a model
that has its own objective, one that has the default, and a tenant class (on the proxy's
series, where a tenant outside the class and the proxy's refusals must not count).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.alerts import config, slo_specs, writer
from inferwatch.mixin import recording
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
CLASS = "premium"
#: the class's tenant on the default model, per minute: proxy TTFT count 8, 7 of them good;
#: 6 ok, 2 engine errors and 5 refusals (left out); another tenant fails everything
CLASS_EXPECTED = {"ttft": 125, "availability": 250}
PROXY_TTFT = "inferwatch_tenancy_time_to_first_token_seconds"


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
    requests = "inferwatch_tenancy_requests_total"
    out += [
        series(f"{PROXY_TTFT}_count", DEFAULT, 8, tenant="acme"),
        series(f"{PROXY_TTFT}_bucket", DEFAULT, 7, tenant="acme", le="2.5"),
        series(requests, DEFAULT, 6, tenant="acme", outcome="ok"),
        series(requests, DEFAULT, 2, tenant="acme", outcome="engine_error"),
        series(requests, DEFAULT, 5, tenant="acme", outcome="rejected_budget"),
        series(f"{PROXY_TTFT}_count", DEFAULT, 8, tenant="initech"),
        series(requests, DEFAULT, 8, tenant="initech", outcome="engine_error"),
    ]
    return out


def record(tool: str, slo: str, name: str, expr: str) -> dict[str, Any]:
    """A tool's ratio, with the tenant class of a class's spec as a label of its own."""
    if "-class-" in name:
        return {
            "record": f"{tool}:{slo}:class_ratio",
            "expr": expr,
            "labels": {"tenant_class": CLASS},
        }
    return {"record": f"{tool}:{slo}:ratio", "expr": expr}


def spec_rules(cfg: config.Config) -> list[dict[str, Any]]:
    """Each spec's ratio recorded as its tool records it, one name per tool and SLO."""
    rules = []
    for spec in slo_specs.sloth(cfg)["slos"]:
        events = spec["sli"]["events"]
        error, total = (
            events[k].replace(slo_specs.SLOTH_WINDOW, WINDOW)
            for k in ("error_query", "total_query")
        )
        rules.append(record("sloth", spec["labels"]["slo"], spec["name"], f"({error}) / ({total})"))
    for spec in slo_specs.openslo(cfg):
        ratio = spec["spec"]["indicator"]["spec"]["ratioMetric"]
        bad, total = (ratio[k]["metricSource"]["spec"]["query"] for k in ("bad", "total"))
        name = spec["metadata"]["name"]
        slo = "ttft" if name.startswith("ttft") else "availability"
        rules.append(record("openslo", slo, name, f"({bad}) / ({total})"))
    for spec in slo_specs.pyrra(cfg):
        latency = spec["spec"]["indicator"]["latency"]
        by = f"by ({', '.join(latency['grouping'])})"
        total = f"sum {by} (rate({latency['total']['metric']}[{WINDOW}]))"
        good = f"sum {by} (rate({latency['success']['metric']}[{WINDOW}]))"
        name = spec["metadata"]["name"]
        rules.append(record("pyrra", "ttft", name, f"({total} - {good}) / {total}"))
    return rules


def test_the_exported_slis_give_our_recorded_error_ratios(promtool: str, tmp_path: Path) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "slo": {
                    "ttft": {"models": {OWN: 0.995}},
                    "availability": {"models": {OWN: 0.9995}},
                    "tenant_classes": {
                        CLASS: {"tenants": ["acme"], "ttft": 0.995, "availability": 0.9995}
                    },
                }
            }
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
        ours = recording.class_error_ratio(cfg, slo, WINDOW)
        on_class = f"on ({', '.join(IDENTITY)}, tenant_class)"
        exp = [
            {
                "labels": f'{{cluster="c1",model="{DEFAULT}",model_version="v1",'
                f'tenant_class="{CLASS}"}}',
                "value": CLASS_EXPECTED[slo],
            }
        ]
        tests.append(
            {
                "expr": f"round(1000 * sum by ({', '.join(IDENTITY)}, tenant_class) ({ours}))",
                "eval_time": "10m",
                "exp_samples": exp,
            }
        )
        for tool in tools:
            theirs = f"{tool}:{slo}:class_ratio"
            tests.append(
                {"expr": f"round(1000 * {theirs})", "eval_time": "10m", "exp_samples": exp}
            )
            tests.append(
                {
                    "expr": f"abs({ours} - {on_class} {theirs}) > 1e-9",
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
