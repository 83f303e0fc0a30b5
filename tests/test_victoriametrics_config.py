"""The VictoriaMetrics path's configs: vmagent's scrape config generated from the jobs the
demo's Prometheus scrapes, checked by the real vmagent, its committed copy fresh; the
generated rules loaded by the real vmalert as they are."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from inferwatch.cli import main as cli
from inferwatch.demo import topology
from support.shared import tool

pytestmark = pytest.mark.proc

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "deploy" / "victoriametrics" / "vmagent.yml"
RULES = REPO / "alerts" / "generated"


def test_the_scrape_config_has_the_prometheus_jobs_with_an_external_cluster_label() -> None:
    """One list of targets: vmagent's jobs are the demo Prometheus's, the cluster an
    external label and on every target."""
    ports = topology.Ports.assign(18000)
    prometheus = yaml.safe_load(topology.prometheus_config(ports))
    agent = yaml.safe_load(topology.vmagent_config(ports, "east"))
    assert agent["global"]["external_labels"] == {"cluster": "east"}
    for job in prometheus["scrape_configs"]:
        for group in job["static_configs"]:
            assert group["labels"]["cluster"] == topology.CLUSTER
            group["labels"]["cluster"] = "east"
    assert agent["scrape_configs"] == prometheus["scrape_configs"]


def test_committed_config_is_fresh_and_a_stale_one_fails_check(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["generate", "vmagent", "--out", str(EXAMPLE), "--check"])
    assert result.exit_code == 0, result.output
    assert EXAMPLE.read_text(encoding="utf-8").startswith(topology.VMAGENT_MARKER)
    stale = tmp_path / "vmagent.yml"
    stale.write_text(EXAMPLE.read_text(encoding="utf-8").replace("18003", "18004"))
    result = CliRunner().invoke(cli, ["generate", "vmagent", "--out", str(stale), "--check"])
    assert result.exit_code == 1
    assert result.output.strip().endswith("is stale: run inferwatch generate vmagent")


def test_the_written_config_names_the_ports_and_cluster_and_vmagent_accepts_it(
    tmp_path: Path,
) -> None:
    vmagent = tool("vmagent")
    out = tmp_path / "vmagent.yml"
    args = ["generate", "vmagent", "--base-port", "20000", "--cluster", "west", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "not checked by" not in result.output  # vmagent -dryRun checked it
    document = yaml.safe_load(out.read_text(encoding="utf-8"))
    sidecars = next(j for j in document["scrape_configs"] if j["job_name"] == topology.SIDECAR_JOB)
    ports = topology.Ports.assign(20000)
    assert [g["targets"] for g in sidecars["static_configs"]] == [
        [f"127.0.0.1:{port}"] for port in ports.sidecar.values()
    ]
    assert {g["labels"]["cluster"] for j in document["scrape_configs"]
            for g in j["static_configs"]} == {"west"}  # fmt: skip
    check = subprocess.run([vmagent, "-dryRun", f"-promscrape.config={out}"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--cluster", ""], "--cluster '': a printable label value"),
        (["--cluster", "a\x1bb"], "a printable label value"),
        (["--cluster", "x" * 129], "a printable label value of 1 to 128"),
        (["--base-port", "65530"], "--base-port 65530: the fleet's ports would run to"),
    ],
)
def test_a_bad_option_is_one_clear_line(args: list[str], words: str) -> None:
    result = CliRunner().invoke(cli, ["generate", "vmagent", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


def test_a_config_vmagent_refuses_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vmagent check runs: a job vmagent cannot read stops the write, with its reason."""
    tool("vmagent")
    broken = topology.vmagent_config(topology.Ports.assign(18000)) + "  no_such_field: 1\n"
    monkeypatch.setattr(topology, "vmagent_config", lambda ports, cluster: broken)
    out = tmp_path / "vmagent.yml"
    result = CliRunner().invoke(cli, ["generate", "vmagent", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "vmagent" in result.output and "nothing written" in result.output
    assert not out.exists()


def test_vmalert_loads_the_generated_rules_unchanged() -> None:
    """Every committed rule file (alerting and recording) parses and validates as MetricsQL
    and Go templates in vmalert, as promtool checks them for Prometheus."""
    vmalert = tool("vmalert")
    files = sorted(RULES.glob("*.yaml"))
    assert len(files) >= 6
    check = subprocess.run(
        [vmalert, "-dryRun", "-rule.validateExpressions", "-rule.validateTemplates",
         *(f"-rule={path}" for path in files)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr[-2000:]


def test_vmalert_refuses_a_rule_it_cannot_parse(tmp_path: Path) -> None:
    """The check above can fail: vmalert -dryRun exits non-zero on a bad expression."""
    vmalert = tool("vmalert")
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(\n")
    check = subprocess.run([vmalert, "-dryRun", f"-rule={bad}"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode != 0
