"""The mapping config: matcher semantics, and one clear error per class of mistake."""

from __future__ import annotations

import importlib
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import support.runbooks_harness as h
from inferwatch.cli import main
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks import registry
from inferwatch.runbooks.config import ConfigError

pytestmark = pytest.mark.unit


def rule(**changes: Any) -> dict[str, Any]:
    return {**h.config()["rules"][0], **changes}


def test_the_shipped_config_loads() -> None:
    shipped = resources.files("inferwatch.runbooks").joinpath("actions.yaml")
    with resources.as_file(shipped) as path:
        config = mapping.load(path)
    assert config.execute is False
    assert {r.action for r in config.rules} == {"isolate_replica"}


@pytest.mark.parametrize(
    ("matcher", "labels", "expected"),
    [
        ('severity="critical"', {"severity": "critical"}, True),
        ('severity="critical"', {"severity": "warning"}, False),
        ('severity!="critical"', {}, True),
        ('action=~"reset_gpu|reboot_node"', {"action": "reset_gpu"}, True),
        ('action=~"reset"', {"action": "reset_gpu"}, False),  # anchored, as in Alertmanager
        ('action!~"reset.*"', {"action": "reset_gpu"}, False),
        ('namespace=""', {}, True),  # an absent label is the empty string
    ],
)
def test_matchers_follow_alertmanager(matcher: str, labels: dict[str, str], expected: bool) -> None:
    config = mapping.parse(h.config(rules=[rule(matchers=[matcher])]))
    assert bool(config.rules_for({"alertname": "InferwatchGPUXidErrors", **labels})) is expected


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            h.config(rules=[rule(action="reboot_everything")]),
            r"rules\[0\]\.action: 'reboot_everything' is not one of",
        ),
        (
            h.config(rules=[rule(matchers=["severity=critical"])]),
            r"rules\[0\]\.matchers\[0\]: .* is not label=\"value\"",
        ),
        (
            h.config(rules=[rule(matchers=['a=~"("'])]),
            r"rules\[0\]\.matchers\[0\]: bad regular expression",
        ),
        (
            h.config(rules=[rule(cooldown="soon")]),
            r"rules\[0\]\.cooldown: expected a duration .*, got 'soon'",
        ),
        (h.config(rules=[rule(typo=1)]), r"rules\[0\]\.typo: unknown field"),
        (h.config(rules=[rule(), rule()]), r"rules: duplicate rule names"),
        ({k: v for k, v in h.config().items() if k != "namespaces"}, r"namespaces: is required"),
        (h.config(breaker={"max_fraction": 2}), r"breaker\.max_fraction: expected"),
        (  # the population is the inventory's, never a number in the config
            h.config(breaker={"max_fraction": 0.5, "populations": {"a": 1}}),
            r"breaker\.populations: unknown field",
        ),
        (
            h.config(inventory={"replicas": {"static": [{"instance": 7}]}}),
            r"inventory\.replicas\.static\[0\]: expected a map of label to string",
        ),
        (
            h.config(inventory={"nodes": {"haproxy": {"runtime": "/s"}}}),
            r"inventory\.nodes\.haproxy: a nodes inventory comes from static or kubernetes",
        ),
        (
            h.config(inventory={"replicas": {"kubernetes": {"selector": "a=b"}}}),
            r"inventory\.replicas\.kubernetes\.namespace: is required",
        ),
        (h.config(inventory={"gpus": {}}), r"inventory\.gpus: unknown field"),
        (h.config(execute="yes"), r"execute: expected true or false"),
        (h.config(actions={"nope": {}}), r"actions\.nope"),
    ],
)
def test_mistakes_name_file_field_and_reason(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"^test\.yaml: {message}"):
        mapping.parse(document, "test.yaml")


def test_check_config_cli_gives_one_line_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("namespaces: [x]\nbreaker: {max_fraction: 0.5}\nrules: [\n")
    result = CliRunner().invoke(main, ["runbooks", "check-config", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"Error: {path}: line")
    assert "Traceback" not in result.output


def test_serve_refuses_to_start_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERWATCH_RUNBOOKS_TOKEN", raising=False)
    result = CliRunner().invoke(main, ["runbooks", "serve"])
    assert result.exit_code == 2 and "a bearer token is required" in result.output


def test_every_registered_action_is_a_class_of_that_name() -> None:
    for name, (module, attribute) in registry.ACTIONS.items():
        cls = getattr(importlib.import_module(module), attribute)
        assert cls.name == name
        for method in ("plan", "apply", "verify", "revert"):
            assert callable(getattr(cls, method)), (name, method)


def test_wrong_action_settings_are_one_line() -> None:
    with pytest.raises(ValueError, match=r"^actions\.isolate_replica: .*unexpected keyword"):
        registry.create("isolate_replica", {"tokn_file": "x"})


def test_an_action_whose_optional_client_is_missing_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, _ = registry.ACTIONS["kubernetes_isolate_node"]
    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes -> ImportError
    with pytest.raises(ValueError, match=r"^actions\.kubernetes_isolate_node: needs kubernetes"):
        registry.create("kubernetes_isolate_node", {})
