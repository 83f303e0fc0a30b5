"""Where the generated files point and how Kubernetes finds them, from the alert config: every
runbook_url defaults to a page the receiver serves, and the PrometheusRule and dashboard
ConfigMaps carry the labels the config gives (``release`` for kube-prometheus-stack)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from inferwatch.alerts import config
from inferwatch.alerts import writer as alerts
from inferwatch.cli import main
from inferwatch.dashboards import writer as dashboards
from inferwatch.exitcodes import ExitCode
from inferwatch.runbooks import pages
from inferwatch.runbooks.cli import serve

pytestmark = pytest.mark.unit


def _rule_resource(cfg: config.Config) -> dict[str, object]:
    document = alerts.prometheus_rule(cfg)
    assert isinstance(document, dict)
    return document


def test_every_runbook_url_is_a_page_the_receiver_serves_at_its_default_address() -> None:
    listen = next(p.default for p in serve.params if p.name == "listen")
    shipped = pages.load()
    resource = _rule_resource(config.load())
    urls = [
        rule["annotations"]["runbook_url"]
        for group in resource["spec"]["groups"]  # type: ignore[index]
        for rule in group["rules"]
        if "alert" in rule
    ]
    assert urls
    for url in urls:
        base, _, name = url.rpartition("/runbooks/")
        assert base == f"http://{listen}"
        assert name in shipped


def test_the_prometheus_rule_carries_the_release_label_by_default() -> None:
    labels = _rule_resource(config.load())["metadata"]["labels"]  # type: ignore[index]
    assert labels["release"] == "kube-prometheus-stack"


def test_labels_from_the_config_reach_the_rule_and_the_config_maps(tmp_path: Path) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(
        "kubernetes:\n"
        "  prometheus_rule_labels: {release: monitoring, team.example.com/owner: sre}\n"
        "  dashboard_labels: {grafana_folder_team: sre}\n"
        "links: {runbook_url: 'https://runbooks.example.com/r/{alertname}'}\n",
        encoding="utf-8",
    )
    cfg = config.load(path)
    labels = _rule_resource(cfg)["metadata"]["labels"]  # type: ignore[index]
    assert labels["release"] == "monitoring" and labels["team.example.com/owner"] == "sre"
    assert labels["app.kubernetes.io/name"] == "inferwatch"
    maps = list(dashboards.config_maps(cfg).values())
    assert maps
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_folder_team"] == "sre"
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    text = yaml.safe_dump(alerts.prometheus_rule(cfg))
    assert "https://runbooks.example.com/r/InferwatchEngineDown" in text


@pytest.mark.parametrize(
    ("given", "where"),
    [
        ("kubernetes: {prometheus_rule_labels: {'bad key!': x}}\n", "bad key!"),
        ("kubernetes: {dashboard_labels: {team: 'not a value'}}\n", "not a value"),
        ("kubernetes: {labels: {}}\n", "labels"),
    ],
)
def test_a_bad_label_is_one_line(tmp_path: Path, given: str, where: str) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(given, encoding="utf-8")
    result = CliRunner().invoke(
        main, ["generate", "alerts", "--config", str(path), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == ExitCode.BAD_INPUT
    (line,) = result.output.splitlines()
    assert str(path) in line and where in line
