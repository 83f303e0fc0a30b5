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


def replicas(count: int, model: str = "llama") -> list[dict[str, str]]:
    return [
        {"instance": f"127.0.0.1:{9400 + i}", "model": model, "namespace": "inference"}
        for i in range(count)
    ]


KUBERNETES_NODES = {"kubernetes": {"selector": "nvidia.com/gpu.present=true"}}


def document(**overrides: Any) -> dict[str, Any]:
    """A mapping whose one rule can act: isolate on a critical XID, in namespace inference."""
    base: dict[str, Any] = {
        "namespaces": ["inference"],
        "breaker": {"max_fraction": 0.5},
        "inventory": {"replicas": {"static": replicas(4)}},
        "rules": [
            {
                "name": "isolate-on-xid",
                "alertname": "InferwatchGPUXidErrors",
                "matchers": ['severity="critical"'],
                "action": "isolate_replica",
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
        ({"inventory": {}},
         "inventory.replicas is not configured, so isolate_replica has no valid target"),
        ({"rules": rule(action="kubernetes_isolate_node")},
         "inventory.nodes is not configured, so kubernetes_isolate_node has no valid target"),
        ({"inventory": {"replicas": {"static": replicas(1) + replicas(1, "qwen")}}},
         "breaker.max_fraction 0.5 of the static replicas inventory's populations (1 at most) "
         "lets no target out"),
        ({"breaker": {"max_fraction": 0.34}, "inventory": {"replicas": {"static": replicas(2)}}},
         "breaker.max_fraction 0.34 of the static replicas inventory's populations (2 at most) "
         "lets no target out"),
        # the SLO burn reads recording rules that keep (cluster, model, model_version) only
        ({"rules": rule(alertname="InferwatchTTFTSLOBurn", matchers=[])},
         "needs one of label(s) instance, pod, replica to name its replicas entry, which "
         "InferwatchTTFTSLOBurn's expression aggregates away"),
        # an action without an inventory reads the alert's namespace for the guard
        ({"rules": rule(alertname="InferwatchTTFTSLOBurn", matchers=[],
                        action="kubernetes_httproute_shift",
                        params={"route": "r", "backend": "b", "fallback": "f"})},
         "needs label(s) namespace, which InferwatchTTFTSLOBurn's expression aggregates away"),
        ({"rules": rule(alertname="InferwatchEngineStalled", matchers=['node=~"gpu-.+"'])},
         "needs label(s) node, which InferwatchEngineStalled's expression aggregates away"),
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
        rules=rule(alertname="InferwatchTTFTSLOBurn", matchers=[],
                   action="kubernetes_httproute_shift",
                   params={"route": "r", "backend": "b", "fallback": "f", "namespace": "x"}),
    )  # fmt: skip
    assert warnings(doc) == []


def test_a_gpu_reset_needs_the_node_to_name_and_the_gpu_from_the_alert() -> None:
    doc = document(
        rules=rule(action="kubernetes_request_gpu_reset", alertname="InferwatchEngineStalled",
                   matchers=[]),
        inventory={"nodes": KUBERNETES_NODES},
    )  # fmt: skip
    assert [w.split(": ", 1)[1] for w in warnings(doc)] == [
        "needs label(s) gpu_uuid, which InferwatchEngineStalled's expression aggregates away",
        "needs one of label(s) node to name its nodes entry, which InferwatchEngineStalled's "
        "expression aggregates away",
    ]


def test_an_inventory_entry_supplies_the_labels_it_names() -> None:
    """The replica's instance (for the admin URL) and namespace come from the entry: an alert
    that names the replica by pod alone can act."""
    doc = document(
        rules=rule(alertname="InferwatchEngineStalled", matchers=[]),
        inventory={"replicas": {"kubernetes": {
            "namespace": "inference", "selector": "app=engine", "port": 9400}}},
    )  # fmt: skip
    assert warnings(doc) == []


def test_a_listing_whose_size_is_known_only_at_run_time_is_not_judged() -> None:
    """One max_fraction below any population's one target: only a static list is judged."""
    doc = document(
        breaker={"max_fraction": 0.01},
        rules=rule(action="kubernetes_isolate_node", alertname="InferwatchGPUEccUncorrectable",
                   matchers=[]),
        inventory={"nodes": KUBERNETES_NODES},
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
    path.write_text(yaml.safe_dump(document(namespaces=[], inventory={})))
    result = CliRunner().invoke(main, ["runbooks", "check-config", str(path)])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [
        'isolate-on-xid: InferwatchGPUXidErrors{severity="critical"} -> isolate_replica'
    ]
    lines = result.stderr.splitlines()
    assert lines[:2] == [
        f"{path}: warning: namespaces: the allow-list is empty, so every alert is refused",
        f"{path}: warning: rules[0] (isolate-on-xid): inventory.replicas is not configured, "
        "so isolate_replica has no valid target",
    ]
    assert lines[2] == f"Error: {path}: 2 warning(s): a rule that can never act"


def test_the_shipped_default_warns_and_the_kits_mappings_pass() -> None:
    """``runbooks/actions.yaml`` configures no inventory; each site's generated mapping acts."""
    shipped = mapping.load(REPO / "runbooks" / "actions.yaml")
    found = lint.warnings(shipped, SHIPPED)
    assert found and all("inventory.replicas is not configured" in w for w in found), found
    overlays = sorted((REPO / "deploy" / "kubernetes" / "overlays").glob("*/receiver-mapping.yaml"))
    assert overlays
    for path in overlays:
        assert lint.warnings(mapping.load(path), SHIPPED) == [], path


def test_check_config_passes_a_mapping_that_can_act_in_silence(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(document()))
    result = CliRunner().invoke(main, ["runbooks", "check-config", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


@pytest.mark.parametrize("sidecars", [[], ["127.0.0.1:9400", "127.0.0.1:9410"], ["h:1"] * 2 +
                                      ["h:2", "h:3"]])  # fmt: skip
def test_local_config_writes_a_mapping_that_check_config_passes_without_a_warning(
    tmp_path: Path, sidecars: list[str]
) -> None:
    """Outside Kubernetes: the shipped rules with a static inventory of the sidecars given
    (the default one on 127.0.0.1:9400 without any), each rule able to act."""
    argv = [arg for address in sidecars for arg in ("--sidecar", address)]
    written = CliRunner().invoke(main, ["runbooks", "local-config", *argv, "--model", "llama"])
    assert written.exit_code == 0, written.output
    path = tmp_path / "actions.yaml"
    path.write_text(written.stdout)
    checked = CliRunner().invoke(main, ["runbooks", "check-config", str(path)])
    assert (checked.exit_code, checked.stderr) == (0, ""), checked.output
    loaded = mapping.load(path)
    shipped = mapping.load(REPO / "runbooks" / "actions.yaml")
    assert [r.name for r in loaded.rules] == [r.name for r in shipped.rules]
    listed = yaml.safe_load(written.stdout)["inventory"]["replicas"]["static"]
    expected = list(dict.fromkeys(sidecars)) or ["127.0.0.1:9400"]
    assert listed == [{"instance": address, "model": "llama"} for address in expected]
    # the breaker is the shipped one where that lets a replica out, else says what it changed
    fraction = yaml.safe_load(written.stdout)["breaker"]["max_fraction"]
    assert fraction == max(shipped.breaker.max_fraction, 1 / len(expected))
    assert ("# breaker.max_fraction" in written.stdout) == (len(expected) < 3)


@pytest.mark.parametrize("bad", ["9400", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:0",
                                 "http://h:9400/metrics", "h:70000"])  # fmt: skip
def test_local_config_refuses_a_sidecar_that_is_not_host_port(bad: str) -> None:
    result = CliRunner().invoke(main, ["runbooks", "local-config", "--sidecar", bad])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [f"Error: --sidecar {bad!r}: expected HOST:PORT"], (
        result.output
    )
