"""Alertmanager webhook payloads (version 4), checked field by field before anything acts.

Every alert of a notification carries its own ``status``: the top-level one is ``firing``
while any alert fires. Label and annotation values are untrusted text; the limits below keep
one payload from holding the receiver's memory or its audit log hostage. A notification whose
envelope is wrong is refused whole; an alert that is wrong (a malformed label, an impossible
date) becomes a :class:`Malformed` in its place, decided and audited on its own, so that it
never costs the other alerts of its notification.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from inferwatch.runbooks.actions.base import Alert

MAX_ALERTS = 1000
MAX_PAIRS = 64
MAX_KEY_CHARS = 128
MAX_VALUE_CHARS = 4096
_FINGERPRINT = re.compile(r"^[0-9a-f]{1,64}$")
# RFC 3339 as Alertmanager writes it (Go's time.Time): 2026-11-30T00:25:23.11723649Z
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")


class PayloadError(ValueError):
    """A payload that is not an Alertmanager v4 webhook; the message names the field."""


@dataclass(frozen=True, slots=True)
class Malformed:
    """An alert of a notification that could not be read: why, and what it could tell."""

    reason: str
    alertname: str = ""
    fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class Notification:
    receiver: str
    group_key: str
    alerts: tuple[Alert | Malformed, ...]
    truncated_alerts: int


def parse(body: bytes) -> Notification:
    """The notification in ``body``; raises :class:`PayloadError` on anything else."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise PayloadError("body is not JSON") from None
    if not isinstance(document, dict):
        raise PayloadError("body is not a JSON object")
    if document.get("version") != "4":
        raise PayloadError(f'version: expected "4", got {_show(document.get("version"))}')
    alerts = document.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts: expected a list")
    if len(alerts) > MAX_ALERTS:
        raise PayloadError(f"alerts: more than {MAX_ALERTS}")
    truncated = document.get("truncatedAlerts", 0)
    if not isinstance(truncated, int) or isinstance(truncated, bool) or truncated < 0:
        raise PayloadError("truncatedAlerts: expected a non-negative integer")
    return Notification(
        receiver=_text(document, "receiver", "receiver"),
        group_key=_text(document, "groupKey", "groupKey"),
        alerts=tuple(_alert_or_malformed(raw, f"alerts[{i}]") for i, raw in enumerate(alerts)),
        truncated_alerts=truncated,
    )


def _alert_or_malformed(raw: Any, where: str) -> Alert | Malformed:
    try:
        return _alert(raw, where)
    except PayloadError as exc:
        known = raw if isinstance(raw, dict) else {}
        labels = known.get("labels")
        name = labels.get("alertname") if isinstance(labels, dict) else None
        fingerprint = known.get("fingerprint")
        return Malformed(
            str(exc),
            name[:MAX_KEY_CHARS] if isinstance(name, str) else "",
            fingerprint[:64] if isinstance(fingerprint, str) else "",
        )


def _alert(raw: Any, where: str) -> Alert:
    if not isinstance(raw, dict):
        raise PayloadError(f"{where}: expected an object")
    status = raw.get("status")
    if status not in ("firing", "resolved"):
        raise PayloadError(f"{where}.status: expected firing or resolved, got {_show(status)}")
    labels = _pairs(raw.get("labels"), f"{where}.labels")
    if not labels.get("alertname"):
        raise PayloadError(f"{where}.labels: alertname is missing")
    fingerprint = _text(raw, "fingerprint", f"{where}.fingerprint")
    if not _FINGERPRINT.match(fingerprint):
        raise PayloadError(f"{where}.fingerprint: expected hex digits")
    starts_at = _text(raw, "startsAt", f"{where}.startsAt")
    ends_at = _text(raw, "endsAt", f"{where}.endsAt")
    for name, value in (("startsAt", starts_at), ("endsAt", ends_at)):
        try:
            epoch(value)
        except ValueError:
            raise PayloadError(f"{where}.{name}: expected an RFC 3339 time") from None
    return Alert(
        status=status,
        labels=labels,
        annotations=_pairs(raw.get("annotations", {}), f"{where}.annotations"),
        starts_at=starts_at,
        ends_at=ends_at,
        fingerprint=fingerprint,
        generator_url=_text(raw, "generatorURL", f"{where}.generatorURL", required=False),
    )


def _pairs(raw: Any, where: str) -> Mapping[str, str]:
    if not isinstance(raw, dict):
        raise PayloadError(f"{where}: expected an object of strings")
    if len(raw) > MAX_PAIRS:
        raise PayloadError(f"{where}: more than {MAX_PAIRS} entries")
    for key, value in raw.items():
        if not isinstance(value, str) or len(key) > MAX_KEY_CHARS or len(value) > MAX_VALUE_CHARS:
            raise PayloadError(f"{where}.{key[:MAX_KEY_CHARS]}: expected a bounded string")
    return dict(raw)


def _text(raw: Mapping[str, Any], key: str, where: str, required: bool = True) -> str:
    value = raw.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS:
        raise PayloadError(f"{where}: expected a string")
    return value


def epoch(timestamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 time with up to nanoseconds (Go's format);
    ``ValueError`` for anything else, an impossible date included."""
    if not _TIMESTAMP.match(timestamp):
        raise ValueError(f"not an RFC 3339 time: {timestamp[:40]!r}")
    head, dot, rest = timestamp.partition(".")
    if dot:
        digits = rest.rstrip("Z").split("+")[0].split("-")[0]
        zone = rest[len(digits) :]
        timestamp = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _show(value: Any) -> str:
    return repr(value)[:40]
