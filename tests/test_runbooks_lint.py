"""``runbooks check-config`` warns about every mapping rule that can never act, one line each,
exit 1; a mapping whose every rule can act passes without a word."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks import lint
from support.shared import REPO

pytestmark = pytest.mark.unit

SHIPPED = lint.shipped_alerts(REPO / "alerts" / "generated")


def document(**overrides: Any) -> dict[str, Any]:
    """A mapping whose one rule can act: isolate on a critical XID, in namespace inference."""
    base: dict[str, Any] = {
        "namespaces": ["inference"],
        "breaker": {"max_fraction": 0.5, "populations": {"inference/llama": 4}},
        "rules": [
            {
                "name": "isolate-on-xid",
                "alertname": "InferwatchGPUXidErrors",
                "matchers": ['severity="critical"'],
                "action": "isolate_replica",
                "params": {"group": "{namespace}/llama"},
            }
        ],
    }
    base.update(overrides)
    return base


def rule(**fields: Any) -> list[dict[str, Any]]:
    return [{**document()["rules"][0], **fields}]


def warnings(doc: dict[str, Any]) -> list[str]:
    return lint.warnings(mapping.parse(doc, "test.yaml"), SHIPPED)


def test_a_mapping_that_can_act_has_no_warning() -> None:
    assert warnings(document()) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"namespaces": []}, "namespaces: the allow-list is empty"),
        ({"rules": rule(alertname="InferwatchGPUXidError")},
         "alert InferwatchGPUXidError is not one the shipped rules fire"),
        ({"rules": rule(matchers=['severity="page"'])},
         "no shipped rule of InferwatchGPUXidErrors has labels its matchers accept"),
        ({"breaker": {"max_fraction": 0.5, "populations": {}}},
         "breaker.populations names no group '{namespace}/llama' for isolate_replica"),
        ({"rules": rule(params={"group": "pool-{node}"})},
         "breaker.populations names no group 'pool-{node}' for isolate_replica"),
        ({"breaker": {"max_fraction": 0.34, "populations": {"inference/llama": 2}}},
         "breaker.max_fraction 0.34 of group '{namespace}/llama' (2 at most) lets no unit out"),
        ({"rules": rule(action="kubernetes_isolate_node", params={})},
         "breaker.populations names no group 'nodes' for kubernetes_isolate_node"),
        # the SLO burn reads recording rules that keep (cluster, model, model_version) only
        ({"rules": rule(alertname="InferwatchTTFTSLOBurn", matchers=[])},
         "needs label(s) instance, namespace, which InferwatchTTFTSLOBurn's expression "
         "aggregates away"),
        ({"rules": rule(alertname="InferwatchFailingOpen", matchers=[],
                        params={"group": "inference/llama"})},
         "needs label(s) instance, namespace"),
        ({"rules": rule(alertname="InferwatchFailingOpen", matchers=['pod=~".+"'],
                        params={"group": "inference/llama"}), "namespaces": ["*"]},
         "needs label(s) instance, pod"),
    ],
)  # fmt: skip
def test_each_rule_that_can_never_act_is_one_warning(
    overrides: dict[str, Any], expected: str
) -> None:
    (found,) = warnings(document(**overrides))
    assert expected in found, found


def test_an_allow_list_of_any_or_none_needs_no_namespace_label() -> None:
    doc = document(
        namespaces=["", "inference"],
        rules=rule(alertname="InferwatchFailingOpen", matchers=[],
                   params={"group": "inference/llama", "admin_url": "http://10.0.0.1:9400/x"}),
    )  # fmt: skip
    assert warnings(doc) == []


@pytest.mark.parametrize(
    ("expression", "keeps", "loses"),
    [
        ("sum by (cluster, model) (rate(x[5m]))", {"model"}, {"namespace"}),
        ("max without (scope) (x - x offset 10m)", {"namespace", "pod"}, {"scope"}),
        ("a / on (model) b", {"model"}, {"pod"}),
        ("a / ignoring (signal) group_left sum by (model) (b) > 0.05", {"pod", "signal"}, set()),
        ("a / ignoring (signal) b", {"pod"}, {"signal"}),
        ("a / on (model) group_right b", {"pod", "model"}, set()),
        ("(sum by (pod) (a) + sum by (pod) (b)) > 0 and on (pod) c == 0", {"pod"}, {"job"}),
        ("histogram_quantile(0.99, sum by (le, model) (rate(x[5m])))", {"model"}, {"le"}),
        ("count(x)", set(), {"model"}),
        ("topk(3, x)", {"pod"}, set()),
        ("5 < x", {"pod"}, set()),
    ],
)
def test_the_labels_an_expression_keeps(expression: str, keeps: set[str], loses: set[str]) -> None:
    result = lint.kept(promql_parser.parse(expression), {})
    assert all(result.has(label) for label in keeps), result
    assert not any(result.has(label) for label in loses), result


def test_a_recording_rules_series_keeps_what_its_rule_keeps() -> None:
    recorded = {"model:x:rate5m": lint.kept(promql_parser.parse("sum by (model) (x)"), {})}
    result = lint.kept(promql_parser.parse("model:x:rate5m > 1"), recorded)
    assert result.has("model") and not result.has("namespace")


def test_check_config_prints_the_rules_and_warns_one_line_each_with_exit_1(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mine.yaml"
    empty = {"max_fraction": 0.5, "populations": {}}
    path.write_text(yaml.safe_dump(document(namespaces=[], breaker=empty)))
    result = CliRunner().invoke(main, ["runbooks", "check-config", str(path)])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [
        'isolate-on-xid: InferwatchGPUXidErrors{severity="critical"} -> isolate_replica'
    ]
    lines = result.stderr.splitlines()
    assert lines[:2] == [
        f"{path}: warning: namespaces: the allow-list is empty, so every alert is refused",
        f"{path}: warning: rules[0] (isolate-on-xid): breaker.populations names no group "
        "'{namespace}/llama' for isolate_replica",
    ]
    assert lines[2] == f"Error: {path}: 2 warning(s): a rule that can never act"


def test_check_config_passes_a_mapping_that_can_act_in_silence(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(document()))
    result = CliRunner().invoke(main, ["runbooks", "check-config", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
