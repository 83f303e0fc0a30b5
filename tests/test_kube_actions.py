"""The Kubernetes runbook actions, through the official client, against the fake API server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import requests
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kubernetes import client

from inferwatch.drill.kubefake import FakeKube, httproute_validator
from inferwatch.exporters.gpu.xid import catalogue
from inferwatch.runbooks.actions.base import ActionError, Alert, Outcome
from inferwatch.runbooks.actions.gpu_reset_request import PREFIX, REQUESTED, GpuResetRequest
from inferwatch.runbooks.actions.httproute import HTTPRouteShift
from inferwatch.runbooks.actions.kubernetes_api import connect
from inferwatch.runbooks.actions.kubernetes_xid import REMEDIATION, XidRemediation
from inferwatch.runbooks.actions.node_isolation import ISOLATION, TAINT_KEY, NodeIsolation
from inferwatch.runbooks.actions.pod_restart import PodRestart
from inferwatch.runbooks.kube_facts import ACTIONS_RULES
from support.shared import shared_path

pytestmark = pytest.mark.unit

CRD = shared_path("fixtures/crds/gateway.networking.k8s.io_httproutes.yaml")
GPU = "GPU-5fa1c0de-1234-5678-9abc-def012345678"
OPERATOR_TAINT = {"key": "example.com/maintenance", "value": "disk", "effect": "NoSchedule"}


def alert(fingerprint: str = "a1b2c3", **labels: str) -> Alert:
    base = {"alertname": "InferwatchGPUXidErrors", "node": "gpu-1", "gpu_uuid": GPU}
    return Alert(
        status="firing",
        labels={**base, **labels},
        annotations={},
        starts_at="2026-12-01T08:00:00.123456789Z",
        ends_at="0001-01-01T00:00:00Z",
        fingerprint=fingerprint,
    )


@pytest.fixture(scope="module")
def validator() -> Callable[[Mapping[str, Any]], None]:
    return httproute_validator(str(CRD))


@pytest.fixture
def fake(validator: Callable[[Mapping[str, Any]], None]) -> FakeKube:
    return FakeKube(validator)


@pytest.fixture(scope="module")
def offline() -> Iterator[client.ApiClient]:
    """For planning, which does no I/O: nothing listens on port 9."""
    with connect("http://127.0.0.1:9") as api_client:
        yield api_client


@pytest.fixture
def host(fake: FakeKube) -> Iterator[str]:
    with fake.serve() as url:
        yield url


@pytest.fixture
def api(host: str) -> Iterator[client.ApiClient]:
    with connect(host) as api_client:
        yield api_client


def run(coro: Any) -> Outcome:
    result: Outcome = asyncio.run(coro)
    return result


def ours(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints", []) if t["key"] == TAINT_KEY]


# -- node isolation -------------------------------------------------------------------------


def test_isolation_cordons_taints_and_annotates_reason_and_fingerprint(fake, api) -> None:
    fake.add_node("gpu-1")
    action = NodeIsolation(api)
    [step] = action.plan(alert(xid="79", action="reboot_node"), {"no_execute": True})
    outcome = run(action.apply(step))
    assert outcome.ok and outcome.changed, outcome.detail
    node = fake.get("nodes", "", "gpu-1")
    assert node["spec"]["unschedulable"] is True
    assert {(t["key"], t["effect"]) for t in ours(node)} == {
        (TAINT_KEY, "NoSchedule"),
        (TAINT_KEY, "NoExecute"),
    }
    record = json.loads(node["metadata"]["annotations"][ISOLATION])
    assert record["alerts"] == {"a1b2c3": f"InferwatchGPUXidErrors XID 79 on {GPU} (reboot_node)"}
    assert record["cordoned"] is True
    assert fake.requests[-1].content_type == "application/merge-patch+json"
    assert run(action.verify(step)).ok


def test_isolation_reapplied_is_a_noop_that_writes_nothing(fake, api) -> None:
    fake.add_node("gpu-1")
    action = NodeIsolation(api)
    [step] = action.plan(alert(), {})
    assert run(action.apply(step)).changed
    version = fake.get("nodes", "", "gpu-1")["metadata"]["resourceVersion"]
    patches = fake.count("PATCH")
    again = run(action.apply(step))
    assert again.ok and not again.changed
    assert fake.count("PATCH") == patches
    assert fake.get("nodes", "", "gpu-1")["metadata"]["resourceVersion"] == version


def test_second_receiver_loses_the_race_with_409_and_adds_nothing(fake, host) -> None:
    fake.add_node("gpu-1")
    fake.line_up_reads(2)  # both read the same resourceVersion before either writes
    with connect(host) as first_api, connect(host) as second_api:
        first, second = NodeIsolation(first_api), NodeIsolation(second_api)
        [step] = first.plan(alert(), {})

        async def both() -> list[Outcome]:
            return list(await asyncio.gather(first.apply(step), second.apply(step)))

        outcomes = asyncio.run(both())
    assert all(o.ok for o in outcomes), outcomes
    assert sorted(o.changed for o in outcomes) == [False, True]
    assert fake.count("PATCH", 409) == 1
    node = fake.get("nodes", "", "gpu-1")
    assert len(ours(node)) == 1
    assert len(fake.written) == 1


def test_conflicts_are_retried_a_bounded_number_of_times(fake, api) -> None:
    fake.add_node("gpu-1")
    fake.after_read = fake.touch  # another writer changes the node after every read
    action = NodeIsolation(api, retries=3)
    [step] = action.plan(alert(), {})
    outcome = run(action.apply(step))
    assert not outcome.ok and not outcome.changed
    assert "4 conflicting writes (409)" in outcome.detail
    assert fake.count("PATCH", 409) == 4 and fake.count("PATCH") == 4
    assert ours(fake.get("nodes", "", "gpu-1")) == []


def test_forbidden_is_a_failed_outcome_naming_the_rule(fake, api) -> None:
    fake.add_node("gpu-1")
    fake.rules = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    action = NodeIsolation(api)
    [step] = action.plan(alert(), {})
    outcome = run(action.apply(step))
    assert not outcome.ok and not outcome.changed
    assert "forbidden" in outcome.detail and 'cannot patch resource "nodes"' in outcome.detail
    assert outcome.observed["status"] == 403


def test_missing_node_is_a_failed_outcome(fake, api) -> None:
    action = NodeIsolation(api)
    [step] = action.plan(alert(node="gpu-9"), {})
    for outcome in (run(action.apply(step)), run(action.verify(step)), run(action.revert(step))):
        assert (
            not outcome.ok and "not found" in outcome.detail and 'nodes "gpu-9"' in outcome.detail
        )


def test_unreachable_api_server_is_a_failed_outcome() -> None:
    with connect("http://127.0.0.1:9") as api:
        action = NodeIsolation(api)
        [step] = action.plan(alert(), {})
        outcome = run(action.apply(step))
    assert not outcome.ok and "unreachable" in outcome.detail


def test_revert_leaves_the_operators_taint_and_cordon(fake, api) -> None:
    fake.add_node("gpu-1", taints=[OPERATOR_TAINT], unschedulable=True)
    action = NodeIsolation(api)
    [step] = action.plan(alert(), {})
    assert run(action.apply(step)).changed
    assert len(fake.get("nodes", "", "gpu-1")["spec"]["taints"]) == 2
    outcome = run(action.revert(step))
    assert outcome.ok and outcome.changed
    node = fake.get("nodes", "", "gpu-1")
    assert node["spec"]["taints"] == [OPERATOR_TAINT]
    assert node["spec"]["unschedulable"] is True
    assert ISOLATION not in node["metadata"]["annotations"]
    assert not run(action.revert(step)).changed


def test_revert_uncordons_only_when_inferwatch_cordoned(fake, api) -> None:
    fake.add_node("gpu-1")
    action = NodeIsolation(api)
    [step] = action.plan(alert(), {})
    run(action.apply(step))
    run(action.revert(step))
    node = fake.get("nodes", "", "gpu-1")
    assert "unschedulable" not in node["spec"] and "taints" not in node["spec"]


def test_node_stays_isolated_until_the_last_alert_reverts(fake, api) -> None:
    fake.add_node("gpu-1")
    action = NodeIsolation(api)
    [first] = action.plan(alert("f1"), {})
    [second] = action.plan(alert("f2"), {})
    assert run(action.apply(first)).changed
    assert run(action.apply(second)).changed  # records the second alert, adds no taint
    assert len(ours(fake.get("nodes", "", "gpu-1"))) == 1
    assert "other alerts" in run(action.revert(first)).detail
    assert len(ours(fake.get("nodes", "", "gpu-1"))) == 1
    assert run(action.revert(second)).detail.endswith("released")
    assert ours(fake.get("nodes", "", "gpu-1")) == []


@pytest.mark.parametrize(
    "params",
    [
        {"taint_key": "bad key!"},
        {"no_execute": "yes"},
        {"taint_value": "x" * 64},
        {"group": "nodes"},  # the population is the receiver's inventory's
        {"no_exceute": True},  # a typo is refused, not ignored
    ],
)
def test_bad_parameters_are_refused_at_plan_time(offline, params) -> None:
    with pytest.raises(ActionError):
        NodeIsolation(offline).plan(alert(), params)


@pytest.mark.parametrize("node", ["", "Gpu_1", "a/b", "x" * 254])
def test_bad_node_label_is_refused_at_plan_time(offline, node) -> None:
    with pytest.raises(ActionError, match="node"):
        NodeIsolation(offline).plan(alert(node=node), {})


# -- XID class → remediation ------------------------------------------------------------------


@pytest.mark.parametrize("xid", sorted(catalogue()))
def test_every_catalogue_xid_maps_to_its_remediation(offline, xid) -> None:
    action = XidRemediation(offline)
    info = catalogue()[xid]
    labelled = alert(xid=str(xid), namespace="inference", pod="llama-0")
    chosen = REMEDIATION.get(info.action)
    if chosen is None:
        with pytest.raises(ActionError, match=f"class {info.action}"):
            action.plan(labelled, {})
        return
    [step] = action.plan(labelled, {})
    assert step.action == chosen
    assert (
        step.unit
        == {"restart_app": "replica", "reset_gpu": "gpu", "reboot_node": "node"}[info.action]
    )


def test_action_label_wins_and_unknown_class_is_refused(offline) -> None:
    action = XidRemediation(offline)
    [step] = action.plan(alert(xid="13", action="reboot_node"), {})
    assert step.action == NodeIsolation.name
    with pytest.raises(ActionError, match="not one of"):
        action.plan(alert(xid="13", action="explode"), {})
    with pytest.raises(ActionError, match="xid"):
        action.plan(alert(xid="13; rm"), {})


def test_xid_steps_apply_through_the_chosen_action(fake, api) -> None:
    fake.add_node("gpu-1")
    action = XidRemediation(api)
    [step] = action.plan(alert(xid="79"), {})
    assert run(action.apply(step)).changed
    assert fake.get("nodes", "", "gpu-1")["spec"]["unschedulable"] is True
    assert run(action.verify(step)).ok
    assert run(action.revert(step)).changed


# -- GPU reset request ------------------------------------------------------------------------


def test_gpu_reset_request_is_annotated_labelled_and_withdrawn(fake, api) -> None:
    fake.add_node("gpu-1")
    action = GpuResetRequest(api)
    [step] = action.plan(alert(xid="95"), {})
    assert run(action.apply(step)).changed
    node = fake.get("nodes", "", "gpu-1")
    request = json.loads(node["metadata"]["annotations"][PREFIX + GPU])
    assert request["xid"] == "95" and request["fingerprint"] == "a1b2c3"
    assert node["metadata"]["labels"][REQUESTED] == "true"
    assert "unschedulable" not in node["spec"]  # a reset does not take the node away
    assert not run(action.apply(step)).changed
    assert run(action.verify(step)).ok
    assert run(action.revert(step)).changed
    node = fake.get("nodes", "", "gpu-1")
    assert PREFIX + GPU not in node["metadata"]["annotations"]
    assert REQUESTED not in node["metadata"]["labels"]
    assert not run(action.verify(step)).ok


def test_gpu_reset_revert_keeps_another_alerts_request(fake, api) -> None:
    fake.add_node("gpu-1")
    action = GpuResetRequest(api)
    [first] = action.plan(alert("f1", xid="95"), {})
    [second] = action.plan(alert("f2", xid="48"), {})
    run(action.apply(first))
    assert not run(action.apply(second)).changed  # a request is pending already
    assert not run(action.revert(second)).changed
    assert PREFIX + GPU in fake.get("nodes", "", "gpu-1")["metadata"]["annotations"]


@pytest.mark.parametrize("uuid", ["", "0", "GPU-../../x", "GPU-" + "a" * 60])
def test_gpu_reset_refuses_a_bad_uuid(offline, uuid) -> None:
    with pytest.raises(ActionError, match="gpu_uuid"):
        GpuResetRequest(offline).plan(alert(gpu_uuid=uuid), {})


# -- replica restart --------------------------------------------------------------------------


def test_pod_restart_deletes_the_pod_once(fake, api) -> None:
    fake.add_pod("inference", "llama-0", created="2026-12-01T07:00:00Z")
    uid = fake.get("pods", "inference", "llama-0")["metadata"]["uid"]
    action = PodRestart(api)
    [step] = action.plan(alert(namespace="inference", pod="llama-0", model="llama"), {})
    assert step.group == "llama"
    outcome = run(action.apply(step))
    assert outcome.ok and outcome.changed
    assert fake.count("DELETE") == 1
    assert "deletionTimestamp" in fake.get("pods", "inference", "llama-0")["metadata"]
    assert run(action.verify(step)).ok
    assert not run(action.apply(step)).changed  # terminating: not deleted again
    fake.remove("pods", "inference", "llama-0")
    fake.add_pod("inference", "llama-0")  # the StatefulSet's replacement
    assert fake.get("pods", "inference", "llama-0")["metadata"]["uid"] != uid
    assert not run(action.apply(step)).changed
    assert fake.count("DELETE") == 1
    assert run(action.verify(step)).ok
    assert not run(action.revert(step)).changed


def test_pod_restart_precondition_protects_a_replacement(fake, api) -> None:
    """A pod replaced between read and delete is not deleted: its UID differs (409)."""
    fake.add_pod("inference", "llama-0", created="2026-12-01T07:00:00Z")

    def replace(key: Any) -> None:
        fake.after_read = None
        fake.remove("pods", "inference", "llama-0")
        fake.add_pod("inference", "llama-0")

    fake.after_read = replace
    action = PodRestart(api)
    [step] = action.plan(alert(namespace="inference", pod="llama-0"), {})
    outcome = run(action.apply(step))
    assert outcome.ok and not outcome.changed, outcome.detail
    assert fake.count("DELETE", 409) == 1
    assert "deletionTimestamp" not in fake.get("pods", "inference", "llama-0")["metadata"]


def test_pod_restart_of_a_gone_pod_is_a_noop(api) -> None:
    action = PodRestart(api)
    [step] = action.plan(alert(namespace="inference", pod="llama-0"), {})
    outcome = run(action.apply(step))
    assert outcome.ok and not outcome.changed and "gone" in outcome.detail


# -- HTTPRoute weight shift -------------------------------------------------------------------

ROUTE = {
    "parentRefs": [{"name": "inference-gateway"}],
    "rules": [
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
            "backendRefs": [
                {"name": "llama-v2", "port": 8000, "weight": 90},
                {"name": "llama-v1", "port": 8000, "weight": 10},
            ],
        },
        {"backendRefs": [{"name": "other", "port": 8000}]},
    ],
}
SHIFT = {
    "route": "llama",
    "backend": "llama-{model_version}",
    "fallback": "llama-v1",
    "steps": [1 / 3, 2 / 3, 1],
    "step_interval": 0,
}


def weights(route: dict[str, Any]) -> list[int]:
    return [r.get("weight", 1) for r in route["spec"]["rules"][0]["backendRefs"]]


def test_httproute_shift_is_stepwise_read_back_and_reverted_stepwise(fake, api) -> None:
    fake.add_httproute("inference", "llama", ROUTE)
    action = HTTPRouteShift(api)
    [step] = action.plan(alert(namespace="inference", model_version="v2"), SHIFT)
    outcome = run(action.apply(step))
    assert outcome.ok and outcome.changed, outcome.detail
    assert [weights(w) for w in fake.written] == [[60, 40], [30, 70], [0, 100]]
    assert outcome.observed["weights"] == {"0": [0, 100]}
    assert fake.count("GET") >= 6  # every stage read back
    assert run(action.verify(step)).ok
    assert not run(action.apply(step)).changed
    assert len(fake.written) == 3
    fake.written.clear()
    reverted = run(action.revert(step))
    assert reverted.ok and reverted.changed
    assert [weights(w) for w in fake.written] == [[30, 70], [60, 40], [90, 10]]
    route = fake.get("httproutes", "inference", "llama")
    assert route["spec"] == ROUTE and not route["metadata"].get("annotations")
    assert not run(action.revert(step)).changed
    assert not run(action.verify(step)).ok


def test_httproute_shift_resumes_a_partial_shift(fake, api) -> None:
    fake.add_httproute("inference", "llama", ROUTE)
    action = HTTPRouteShift(api)
    [step] = action.plan(alert(namespace="inference", model_version="v2"), SHIFT)
    fake.after_read = None
    run(action.apply(step))
    run(action.revert(step))
    # a receiver that died after the first stage: the record and the first weights are there
    [one] = action.plan(alert(namespace="inference", model_version="v2"), {**SHIFT, "steps": [1]})
    fake.written.clear()
    assert run(action.apply(step)).changed
    assert [weights(w) for w in fake.written] == [[60, 40], [30, 70], [0, 100]]
    assert not run(action.apply(one)).changed


def test_httproute_conflict_is_retried_and_bounded(fake, api) -> None:
    fake.add_httproute("inference", "llama", ROUTE)
    touched: list[int] = []

    def once(key: Any) -> None:
        if not touched:
            touched.append(1)
            fake.touch(key)

    fake.after_read = once
    action = HTTPRouteShift(api, retries=2)
    [step] = action.plan(alert(namespace="inference", model_version="v2"), SHIFT)
    assert run(action.apply(step)).ok
    assert fake.count("PATCH", 409) == 1
    fake.after_read = fake.touch
    failed = run(action.revert(step))
    assert not failed.ok and "3 conflicting writes" in failed.detail


def test_httproute_without_the_fallback_in_the_rule_fails_and_changes_nothing(fake, api) -> None:
    fake.add_httproute("inference", "llama", ROUTE)
    action = HTTPRouteShift(api)
    [step] = action.plan(alert(namespace="inference"), {**SHIFT, "backend": "other"})
    outcome = run(action.apply(step))
    assert not outcome.ok and "not to its fallback llama-v1" in outcome.detail
    assert fake.written == []


def test_httproute_missing_or_forbidden_is_a_failed_outcome(fake, api) -> None:
    action = HTTPRouteShift(api)
    [step] = action.plan(alert(namespace="inference", model_version="v2"), SHIFT)
    assert "not found" in run(action.apply(step)).detail
    fake.add_httproute("inference", "llama", ROUTE)
    fake.rules = [
        {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"], "verbs": ["get"]}
    ]
    outcome = run(action.apply(step))
    assert not outcome.ok and "forbidden" in outcome.detail


@pytest.mark.parametrize(
    "params",
    [
        {**SHIFT, "backend": "llama-{missing}"},
        {**SHIFT, "fallback": "llama-v2"},
        {**SHIFT, "steps": 0},
        {**SHIFT, "step_interval": True},
        {**SHIFT, "steps": [0.5, 0.25, 1]},
        {**SHIFT, "weight": 3},
        {k: v for k, v in SHIFT.items() if k != "route"},
        {**SHIFT, "route": "{alertname}"},  # a label value that is no object name
    ],
)
def test_httproute_bad_parameters_are_refused_at_plan_time(offline, params) -> None:
    with pytest.raises(ActionError):
        HTTPRouteShift(offline).plan(alert(namespace="inference", model_version="v2"), params)


# -- the fake API server itself ---------------------------------------------------------------


def test_fake_validates_httproutes_against_the_crd(fake, api) -> None:
    fake.add_httproute("inference", "llama", ROUTE)
    custom = client.CustomObjectsApi(api)
    args = ("gateway.networking.k8s.io", "v1", "inference", "httproutes", "llama")
    bad = {"spec": {"rules": [{"backendRefs": [{"name": "llama-v2", "weight": -1}]}]}}
    with pytest.raises(client.ApiException) as invalid:
        custom.patch_namespaced_custom_object(
            *args, bad, _content_type="application/merge-patch+json"
        )
    assert invalid.value.status == 422 and "weight" in invalid.value.body
    with pytest.raises(client.ApiException) as strategic:
        custom.patch_namespaced_custom_object(
            *args, {}, _content_type="application/strategic-merge-patch+json"
        )
    assert strategic.value.status == 415
    ops = [{"op": "replace", "path": "/spec/rules/0/backendRefs/0/weight", "value": 5}]
    patched = custom.patch_namespaced_custom_object(
        *args, ops, _content_type="application/json-patch+json"
    )
    assert patched["spec"]["rules"][0]["backendRefs"][0]["weight"] == 5
    assert patched["metadata"]["generation"] == 2


def test_without_a_crd_the_fake_keeps_routes_as_written_and_still_conflicts() -> None:
    # the drill runs the fake where the CRD file may be absent: no schema, same semantics
    fake = FakeKube()
    fake.add_httproute("inference", "llama", ROUTE)
    args = ("gateway.networking.k8s.io", "v1", "inference", "httproutes", "llama")
    odd = {"spec": {"rules": [{"backendRefs": [{"name": "llama-v2", "weight": -1}]}]}}
    with fake.serve() as host, connect(host) as api:
        custom = client.CustomObjectsApi(api)
        patched = custom.patch_namespaced_custom_object(
            *args, odd, _content_type="application/merge-patch+json"
        )
        stale = {"metadata": {"resourceVersion": "1"}, "spec": ROUTE}
        with pytest.raises(client.ApiException) as conflict:
            custom.patch_namespaced_custom_object(
                *args, stale, _content_type="application/merge-patch+json"
            )
    assert patched["spec"]["rules"][0]["backendRefs"][0]["weight"] == -1
    assert conflict.value.status == 409


def test_fake_applies_strategic_merge_to_nodes(fake, api) -> None:
    fake.add_node("gpu-1", labels={"pool": "h200"})
    core = client.CoreV1Api(api)
    node = core.patch_node("gpu-1", {"metadata": {"labels": {"extra": "1"}}})
    assert node.metadata.labels == {"kubernetes.io/hostname": "gpu-1", "pool": "h200", "extra": "1"}
    assert fake.requests[-1].content_type == "application/strategic-merge-patch+json"


# -- RBAC -------------------------------------------------------------------------------------


def _exercise_every_action(fake: FakeKube, api: client.ApiClient) -> list[Outcome]:
    fake.add_node("gpu-1")
    fake.add_pod("inference", "llama-0", created="2026-12-01T07:00:00Z")
    fake.add_httproute("inference", "llama", ROUTE)
    labels = {"namespace": "inference", "pod": "llama-0", "model_version": "v2"}
    cases = [
        (XidRemediation(api), alert("n", xid="79", **labels), {}),
        (XidRemediation(api), alert("g", xid="95", **labels), {}),
        (XidRemediation(api), alert("p", xid="13", **labels), {}),
        (HTTPRouteShift(api), alert("h", **labels), SHIFT),
    ]
    outcomes = []
    for action, firing, params in cases:
        for step in action.plan(firing, params):
            outcomes += [run(action.apply(step)), run(action.verify(step))]
            outcomes.append(run(action.revert(step)))
    return outcomes


def test_rbac_rules_are_enough_for_every_action(fake, api) -> None:
    fake.rules = ACTIONS_RULES
    outcomes = _exercise_every_action(fake, api)
    assert all(o.ok for o in outcomes), [o.detail for o in outcomes if not o.ok]
    assert fake.count("GET", 403) + fake.count("PATCH", 403) + fake.count("DELETE", 403) == 0


@pytest.mark.parametrize(
    ("resource", "verb"),
    [(r, v) for rule in ACTIONS_RULES for r in rule["resources"] for v in rule["verbs"]],
)
def test_every_rbac_rule_is_needed(fake, api, resource, verb) -> None:
    fake.rules = [
        {**rule, "verbs": [v for v in rule["verbs"] if (r, v) != (resource, verb)]}
        for rule in ACTIONS_RULES
        for r in rule["resources"]
    ]
    outcomes = _exercise_every_action(fake, api)
    assert any(not o.ok and "forbidden" in o.detail for o in outcomes)


# -- properties -------------------------------------------------------------------------------

LABELS = st.dictionaries(
    st.sampled_from(["node", "gpu_uuid", "xid", "action", "pod", "namespace", "model_version"]),
    st.one_of(st.text(max_size=300), st.sampled_from(["79", "95", "13", "gpu-1", "reset_gpu"])),
)
PARAMS = st.dictionaries(
    st.sampled_from(
        [
            "no_execute",
            "cordon",
            "taint_key",
            "steps",
            "step_interval",
            "route",
            "backend",
            "fallback",
            "group",
            "namespace",
        ]
    ),
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=80)),
)


@settings(max_examples=300, deadline=None)
@given(labels=LABELS, params=PARAMS)
@example(labels={"xid": "\u00b9"}, params={})  # a digit to str.isdigit(), not to int()
@example(labels={"xid": "\u0664\u0668"}, params={})  # Arabic-Indic digits
def test_planning_any_alert_either_plans_or_refuses_with_action_error(offline, labels, params):
    firing = Alert("firing", labels, {}, "2026-12-01T08:00:00Z", "", "f")
    for action in (
        XidRemediation(offline),
        NodeIsolation(offline),
        GpuResetRequest(offline),
        PodRestart(offline),
        HTTPRouteShift(offline),
    ):
        try:
            steps = action.plan(firing, params)
        except ActionError:
            continue
        for step in steps:
            assert len(json.dumps(step.desired)) < 4096  # bounded whatever the labels held


@settings(max_examples=25, deadline=None)
@given(
    backend=st.integers(0, 1000),
    fallback=st.integers(0, 1000),
    steps=st.integers(1, 8),
    pool=st.booleans(),
)
def test_httproute_stages_keep_the_total_and_revert_restores_it(
    validator, backend, fallback, steps, pool
) -> None:
    """``pool``: the failing backend is the Inference Extension's pool of the model's pods,
    as the kit's route names it when the site has an endpoint picker."""
    fake = FakeKube(validator)
    failing = (
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "v2"}
        if pool
        else {"name": "v2", "port": 80}
    )
    spec = {
        "rules": [
            {
                "backendRefs": [
                    {**failing, "weight": backend},
                    {"name": "v1", "port": 80, "weight": fallback},
                ]
            }
        ]
    }
    fake.add_httproute("inference", "llama", spec)
    params = {
        "route": "llama",
        "backend": "v2",
        "fallback": "v1",
        "steps": [i / steps for i in range(1, steps + 1)],
        "step_interval": 0,
    }
    with fake.serve() as host, connect(host) as api:
        action = HTTPRouteShift(api)
        [step] = action.plan(alert(namespace="inference"), params)
        assert run(action.apply(step)).ok
        shifted = [weights(w) for w in fake.written]
        assert run(action.revert(step)).ok
    assert all(sum(w) == backend + fallback for w in shifted)
    assert [w[0] for w in shifted] == sorted((w[0] for w in shifted), reverse=True)
    assert shifted[-1] == [0, backend + fallback]
    assert fake.get("httproutes", "inference", "llama")["spec"] == spec


def test_fake_answers_bad_requests_like_the_api_server(fake, host) -> None:
    fake.add_node("gpu-1")
    url = f"{host}/api/v1/nodes/gpu-1"
    merge = {"Content-Type": "application/merge-patch+json"}
    cases = [
        (requests.patch(url, data=b"{", headers=merge), 400, "BadRequest"),
        (
            requests.patch(url, data=b"{}", headers={"Content-Type": "text/plain"}),
            415,
            "UnsupportedMediaType",
        ),
        (
            requests.patch(url, data=b"x" * (3 * 1024 * 1024 + 1), headers=merge),
            413,
            "RequestEntityTooLarge",
        ),
        (
            requests.patch(url, json={"metadata": {"resourceVersion": "1"}}, headers=merge),
            409,
            "Conflict",
        ),
        (requests.patch(url, json={"metadata": {"name": "other"}}, headers=merge), 422, "Invalid"),
        (requests.get(f"{host}/api/v1/nodes/gpu-1/proxy"), 404, "NotFound"),
        (requests.delete(url), 405, "MethodNotAllowed"),
    ]
    for response, code, reason in cases:
        assert response.status_code == code, response.text
        assert response.json()["kind"] == "Status" and response.json()["reason"] == reason
    version = fake.get("nodes", "", "gpu-1")["metadata"]["resourceVersion"]
    same = requests.patch(url, json={"spec": {"providerID": "fake://gpu-1"}}, headers=merge)
    assert same.json()["metadata"]["resourceVersion"] == version  # no-op: no new version


def test_httproute_stays_shifted_until_the_last_alert_reverts(fake, api) -> None:
    fake.add_httproute("inference", "llama", ROUTE)
    action = HTTPRouteShift(api)
    [first] = action.plan(alert("f1", namespace="inference", model_version="v2"), SHIFT)
    [second] = action.plan(alert("f2", namespace="inference", model_version="v2"), SHIFT)
    assert run(action.apply(first)).changed
    assert run(action.apply(second)).changed  # recorded, weights already moved
    assert len(fake.written) == 4
    kept = run(action.revert(first))
    assert kept.changed and "other alerts" in kept.detail
    assert weights(fake.get("httproutes", "inference", "llama")) == [0, 100]
    assert run(action.revert(second)).changed
    assert fake.get("httproutes", "inference", "llama")["spec"] == ROUTE


def test_httproute_edited_during_a_shift_fails_clearly(fake, api) -> None:
    fake.add_httproute("inference", "llama", ROUTE)
    action = HTTPRouteShift(api)
    [step] = action.plan(alert(namespace="inference", model_version="v2"), SHIFT)
    run(action.apply(step))
    custom = client.CustomObjectsApi(api)
    edit = {"spec": {"rules": [{"backendRefs": [{"name": "llama-v1", "port": 8000}]}]}}
    custom.patch_namespaced_custom_object(
        "gateway.networking.k8s.io",
        "v1",
        "inference",
        "httproutes",
        "llama",
        edit,
        _content_type="application/merge-patch+json",
    )
    outcome = run(action.revert(step))
    assert not outcome.ok and "edited during the shift" in outcome.detail


def test_xid_remediation_passes_each_action_only_its_parameters(offline) -> None:
    action = XidRemediation(offline)
    labels = {"namespace": "inference", "pod": "llama-0"}
    [restart] = action.plan(alert(xid="13", **labels), {"no_execute": True})
    assert restart.action == PodRestart.name
    [isolate] = action.plan(alert(xid="79", **labels), {"no_execute": True})
    assert [t["effect"] for t in isolate.desired["taints"]] == ["NoSchedule", "NoExecute"]
    with pytest.raises(ActionError, match="unknown parameters steps"):
        action.plan(alert(xid="79"), {"steps": [1]})


def test_an_object_the_action_cannot_read_is_a_failed_outcome(fake, api) -> None:
    fake.add_pod("inference", "llama-0", created="yesterday")
    action = PodRestart(api)
    [step] = action.plan(alert(namespace="inference", pod="llama-0"), {})
    outcome = run(action.apply(step))
    assert not outcome.ok and "yesterday" in outcome.detail
    assert fake.count("DELETE") == 0


def test_actions_build_their_client_from_settings(fake, host, tmp_path) -> None:
    """The receiver builds an action from its config settings alone (``cls(**settings)``)."""
    fake.add_node("gpu-1")
    action = XidRemediation(host=host, retries=2)
    [step] = action.plan(alert(xid="79"), {})
    assert run(action.apply(step)).changed
    with pytest.raises(ValueError, match="kubernetes client configuration") as bad:
        NodeIsolation(kubeconfig=str(tmp_path / "missing"))
    assert "\n" not in str(bad.value)
