"""Rules as data: what a builder returns and what the writer serialises.

An ``Alert`` carries what an on-call engineer reads (summary, description with the values
that matter) and where to go next (runbook page, dashboard panel); the links are filled in
from the config here, once, so every alert gets them the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferwatch.mixin.config import Config

__all__ = ["Alert", "Group", "Panel", "Recording"]


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"record": self.record, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


@dataclass(frozen=True)
class Panel:
    """A dashboard panel: board uid ``inferwatch-<board>`` and a panel id stable per alert."""

    board: str
    panel_id: int

    @property
    def uid(self) -> str:
        return f"inferwatch-{self.board}"


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    expr: str
    for_: str
    summary: str
    description: str
    panel: Panel
    labels: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self, config: Config) -> dict[str, Any]:
        settings = config.alert(self.name)
        annotations = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": config.links["runbook_url"].format(alertname=self.name),
            "dashboard_url": config.links["dashboard_url"].format(
                uid=self.panel.uid, panel=self.panel.panel_id
            ),
            **settings.annotations,
        }
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ not in ("0s", "0m"):
            rule["for"] = self.for_
        rule["labels"] = {**self.labels, **settings.labels, "severity": self.severity}
        rule["annotations"] = annotations
        return rule


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Recording | Alert, ...]
