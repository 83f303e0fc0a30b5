"""Every runbook page says how to diagnose in Kubernetes, what the automation does for its alert
in the demo and in the kit (with the undo), and where it escalates, and it says what the code
and the config do: the rules of the shipped mapping (the kit's receiver) and of the demo's,
and the receivers and repeat intervals of the alert config."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.alerts import config, routing, writer
from inferwatch.demo import automation
from inferwatch.runbooks import local
from support.shared import REPO

pytestmark = pytest.mark.unit

RUNBOOKS = REPO / "runbooks"
SECTIONS = (
    "## Meaning",
    "## Impact",
    "## Diagnosis",
    "## Mitigation",
    "## Automation",
    "## Escalation",
)
KUBECTL = ("kubectl -n inference describe", "kubectl -n inference logs", "get events")
RECEIVER = {"critical": "page", "warning": "ticket"}


def severities() -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for name, text in writer.render(config.load()).items():
        if "/" in name:
            continue
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]].add(rule["labels"]["severity"])
    return out


def kit_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = local.shipped()["rules"]
    return rules


def demo_rules() -> list[dict[str, Any]]:
    """The demo's rules, and the drill's (with a Kubernetes API) besides."""
    plain = automation.document(Path("token"), automation.Settings(True, Path("haproxy.sock")))[
        "rules"
    ]
    drill = automation.document(
        Path("token"), automation.Settings(True, Path("haproxy.sock"), kube_host="http://k")
    )
    return [*plain, *(r for r in drill["rules"] if r not in plain)]


def section(text: str, heading: str) -> str:
    start = text.find(heading)
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def named(part: str) -> set[str]:
    """The rule names a list of the automation section starts its items with."""
    return set(re.findall(r"^- `([a-z0-9.-]+)` \(`[a-z_]+`\)", part, re.MULTILINE))


def problems(name: str, text: str, levels: set[str]) -> list[str]:
    """What the page of alert ``name`` lacks or gets wrong; empty when it is complete."""
    found = []
    positions = [text.find(heading) for heading in SECTIONS]
    if -1 in positions or positions != sorted(positions):
        found.append(f"sections {SECTIONS} missing or out of order")
    diagnosis = section(text, "## Diagnosis")
    if "```promql" not in diagnosis or "```sh" not in diagnosis:
        found.append("diagnosis without its PromQL and its Kubernetes commands")
    found += [
        f"diagnosis without {command!r}"
        for command in KUBECTL
        if command not in diagnosis
        and not (command.endswith("describe") and "kubectl describe node" in diagnosis)
    ]
    auto = section(text, "## Automation")
    kit_part, _, demo_part = auto.partition("**In the demo")
    for where, part, rules in (("kit", kit_part, kit_rules()), ("demo", demo_part, demo_rules())):
        mine = [r for r in rules if r["alertname"] == name]
        listed = named(part)
        stale = [n for n in listed if not any(r["name"].startswith(n) for r in mine)]
        found += [f"{where}: the page names {n}, which no rule of the {where} is" for n in stale]
        if not mine:
            if "nothing is automated" not in part:
                found.append(f"{where}: no rule maps the alert, and the page does not say so")
            continue
        for rule in mine:
            if not any(
                rule["name"].startswith(n) and f"(`{rule['action']}`)" in part for n in listed
            ):
                found.append(f"{where}: rule {rule['name']} ({rule['action']}) is not described")
        if part.count("Undo:") < len(listed):
            found.append(f"{where}: an automated action without its undo")
    escalation = section(text, "## Escalation")
    repeat = routing.DEFAULTS["repeat_interval"]
    for level in levels:
        if level in RECEIVER:
            receiver = RECEIVER[level]
            if (
                f"receiver `{receiver}`" not in escalation
                or f"every {repeat[receiver]}" not in escalation
            ):
                found.append(f"escalation: {level} goes to {receiver}, every {repeat[receiver]}")
        elif "receiver `none`" not in escalation:
            found.append("escalation: info alerts are routed nowhere")
    if "Escalate to " not in escalation:
        found.append("escalation: to whom")
    return found


@pytest.fixture(scope="module")
def levels() -> dict[str, set[str]]:
    return severities()


def test_every_alert_has_a_complete_page(levels: dict[str, set[str]]) -> None:
    assert levels
    bad = {
        name: found
        for name in sorted(levels)
        if (
            found := problems(
                name, (RUNBOOKS / f"{name}.md").read_text(encoding="utf-8"), levels[name]
            )
        )
    }
    assert bad == {}


@pytest.mark.parametrize(
    ("mangle", "expected"),
    [
        (lambda text: text.replace("## Escalation", "## Contacts"), "sections"),
        (lambda text: re.sub(r"```sh\n.*?```\n", "", text, flags=re.DOTALL), "Kubernetes commands"),
        (
            lambda text: text.replace(
                "`isolate-replica-on-reset-class-xid` (`isolate_replica`)", "isolation"
            ),
            "is not described",
        ),
        (lambda text: text.replace("Undo:", "Then:"), "without its undo"),
        (lambda text: text.replace("every 4h", "every 8h"), "critical goes to page, every 4h"),
    ],
)
def test_a_page_without_them_fails(mangle: Any, expected: str, levels: dict[str, set[str]]) -> None:
    name = "InferwatchGPUXidErrors"
    text = (RUNBOOKS / f"{name}.md").read_text(encoding="utf-8")
    assert problems(name, text, levels[name]) == []
    assert any(expected in problem for problem in problems(name, mangle(text), levels[name]))


def test_a_page_that_claims_a_rule_no_mapping_has_fails(levels: dict[str, set[str]]) -> None:
    name = "InferwatchTTFTHigh"
    text = (RUNBOOKS / f"{name}.md").read_text(encoding="utf-8")
    claimed = text.replace(
        "**In the kit:** nothing is automated",
        "**In the kit**:\n\n- `scale-up-on-ttft` (`scale`): adds a replica. Undo: none.\n\nX",
    )
    assert any("no rule of the kit" in problem for problem in problems(name, claimed, levels[name]))
