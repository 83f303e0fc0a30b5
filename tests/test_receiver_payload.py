"""The webhook payload parser: every input is either a notification or one PayloadError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.runbooks import payload
from inferwatch.runbooks.actions.base import Alert
from inferwatch.runbooks.payload import PayloadError

pytestmark = pytest.mark.unit

# A real Alertmanager 0.25 notification, as captured in the reference notes (section 4.1).
CAPTURED = {
    "receiver": "pager-and-remediator",
    "status": "firing",
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "LLMKVCacheUsageHigh", "cluster": "c1", "severity": "critical"},
            "annotations": {"summary": "KV cache usage is high."},
            "startsAt": "2026-11-30T00:25:23.11723649Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prom:9090/graph?g0.expr=x",
            "fingerprint": "7f35b58fac4dbac1",
        }
    ],
    "groupLabels": {"alertname": "LLMKVCacheUsageHigh"},
    "commonLabels": {},
    "commonAnnotations": {},
    "externalURL": "http://vm:19093",
    "version": "4",
    "groupKey": '{}/{severity="critical"}:{alertname="LLMKVCacheUsageHigh"}',
    "truncatedAlerts": 0,
}


def test_a_captured_notification_parses() -> None:
    notification = payload.parse(json.dumps(CAPTURED).encode())
    (alert,) = notification.alerts
    assert alert.status == "firing" and alert.fingerprint == "7f35b58fac4dbac1"
    assert alert.labels["alertname"] == "LLMKVCacheUsageHigh"
    assert alert.starts_at == "2026-11-30T00:25:23.11723649Z"
    assert notification.group_key.endswith('{alertname="LLMKVCacheUsageHigh"}')


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_raise_anything_else(body: bytes) -> None:
    try:
        parsed = payload.parse(body)
    except PayloadError as exc:
        assert str(exc), "a refusal says why"
    else:
        assert isinstance(parsed, payload.Notification)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(
        ["status", "labels", "annotations", "startsAt", "endsAt", "fingerprint", "generatorURL"]
    ),
    value=json_values,
)
def test_any_alert_field_replaced_by_any_json_is_parsed_or_refused(field: str, value: Any) -> None:
    """An alert is read, or becomes a Malformed saying why; the others are never affected."""
    document = json.loads(json.dumps(CAPTURED))
    document["alerts"] = [document["alerts"][0], json.loads(json.dumps(document["alerts"][0]))]
    document["alerts"][0][field] = value
    try:
        notification = payload.parse(json.dumps(document).encode())
    except PayloadError as exc:  # a value JSON cannot carry (NaN): the body is not JSON
        assert str(exc) == "body is not JSON"
        return
    spoiled, intact = notification.alerts
    assert isinstance(intact, Alert)
    if isinstance(spoiled, payload.Malformed):
        assert spoiled.reason.startswith("alerts[0].")
        return
    assert spoiled.status in ("firing", "resolved")  # accepted only with well-typed values
    assert all(isinstance(v, str) for v in spoiled.labels.values())


label_names = st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True)
alerts = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["firing", "resolved"]),
        "labels": st.dictionaries(label_names, st.text(max_size=50), max_size=8).map(
            lambda labels: {**labels, "alertname": "A"}
        ),
        "annotations": st.dictionaries(label_names, st.text(max_size=50), max_size=4),
        "startsAt": st.just("2026-11-30T00:25:23.11723649Z"),
        "endsAt": st.just("0001-01-01T00:00:00Z"),
        "fingerprint": st.from_regex(r"[0-9a-f]{16}", fullmatch=True),
    }
)


@settings(max_examples=200, deadline=None)
@given(st.lists(alerts, max_size=5))
def test_well_formed_notifications_keep_every_alert(raw_alerts: list[dict[str, Any]]) -> None:
    document = {**CAPTURED, "alerts": raw_alerts}
    notification = payload.parse(json.dumps(document).encode())
    assert [a.fingerprint for a in notification.alerts] == [a["fingerprint"] for a in raw_alerts]
    assert [dict(a.labels) for a in notification.alerts] == [a["labels"] for a in raw_alerts]
    assert [a.status for a in notification.alerts] == [a["status"] for a in raw_alerts]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 4}, "version"),
        ({"alerts": [{}] * (payload.MAX_ALERTS + 1)}, "more than"),
        ({"truncatedAlerts": -1}, "truncatedAlerts"),
        ({"groupKey": 5}, "groupKey"),
    ],
)
def test_top_level_fields_are_checked(change: dict[str, Any], message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        payload.parse(json.dumps({**CAPTURED, **change}).encode())


def test_label_limits_bound_one_alert() -> None:
    document = json.loads(json.dumps(CAPTURED))
    document["alerts"][0]["labels"].update({f"l{i}": "v" for i in range(payload.MAX_PAIRS)})
    (alert,) = payload.parse(json.dumps(document).encode()).alerts
    assert isinstance(alert, payload.Malformed) and "more than" in alert.reason
    document = json.loads(json.dumps(CAPTURED))
    document["alerts"][0]["labels"]["big"] = "x" * (payload.MAX_VALUE_CHARS + 1)
    (alert,) = payload.parse(json.dumps(document).encode()).alerts
    assert isinstance(alert, payload.Malformed) and "bounded string" in alert.reason
    assert alert.alertname == CAPTURED["alerts"][0]["labels"]["alertname"]


def test_an_impossible_date_is_a_malformed_alert() -> None:
    document = json.loads(json.dumps(CAPTURED))
    document["alerts"][0]["startsAt"] = "2026-02-30T00:25:23.11723649Z"  # the pattern fits
    (alert,) = payload.parse(json.dumps(document).encode()).alerts
    assert isinstance(alert, payload.Malformed)
    assert alert.reason == "alerts[0].startsAt: expected an RFC 3339 time"
