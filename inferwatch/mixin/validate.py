"""Generated files are checked, all of them, before any is written.

A generator hands its whole set of files (``relative path -> text``) and the kind of each;
:func:`check` raises :class:`Invalid` naming the first file, where in it, and why, so that a
config that would give Prometheus, Alertmanager, Grafana or HAProxy a file they refuse
writes nothing at all. Python's checks always run: every YAML and JSON file parses, every
PromQL expression parses (``promql-parser``, the Rust parser GreptimeDB maintains), every
alert label and annotation parses as the Go template Prometheus expands, and names and
addresses are what their field allows; a component declares the kinds of files only it writes
(the gateway's haproxy.cfg). When a kind's tool (``promtool``, ``amtool``, ``haproxy``) is on
PATH, each file of that kind is also checked by it, on a copy in a temporary folder; those that
are not installed are returned, so the command can say which checks did not run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import promql_parser
import yaml

from inferwatch import config as layer
from inferwatch.config import Duration
from inferwatch.config.schema import host_port
from inferwatch.mixin import gotemplate

__all__ = [
    "ALERTMANAGER",
    "DASHBOARD",
    "PROMETHEUS_RULE",
    "RULES",
    "SCRAPE_CONFIG",
    "TEXT",
    "YAML",
    "Invalid",
    "Kind",
    "Problem",
    "Tool",
    "check",
    "promql_error",
    "unchecked_line",
]

#: seconds one external check may take
TOOL_TIMEOUT = 60
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: keys whose string values are PromQL in the manifests we write (Argo, Flagger, KEDA,
#: prometheus-adapter)
_PROMQL_KEYS = frozenset({"expr", "query", "metricsQuery", "seriesQuery"})
#: a controller's or Grafana's placeholder, standing for a range or for label matchers
_RANGE_PLACEHOLDER = re.compile(r"\[\s*(?:\{\{[^{}]*\}\}|<<[^<>]*>>|\$\w+|\$\{\w+\})\s*\]")
_MATCHER_PLACEHOLDER = re.compile(r"\{\{[^{}]*\}\}|<<[^<>]*>>")
_GRAFANA_VARIABLE = re.compile(r"\$(?:\{\w+\}|\w+)")
_URL = re.compile(r"https?://(\[[^\]]*\]|[^/:?#\[\]@]+)(?::([0-9]+))?([/?][^\s#]*)?")


class Invalid(ValueError):
    """A generated file that its consumer would refuse: ``<file>: <where>: <reason>``."""

    def __init__(self, name: str, where: str, reason: str) -> None:
        line = f"{name}: {where}: {reason}" if where else f"{name}: {reason}"
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in line))


@dataclass(frozen=True)
class Tool:
    """An external checker: ``argv`` then the file; ``prepare`` makes the copy it reads."""

    argv: tuple[str, ...]
    prepare: Callable[[str], str] = lambda text: text

    @property
    def name(self) -> str:
        return " ".join(self.argv)


@dataclass(frozen=True)
class Kind:
    """What a generated file is: the Python check of its text, and its external checker."""

    check: Callable[[str], None]
    tool: Tool | None = None


class Problem(Exception):
    """Raised by a check: where in the file, and why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(reason)
        self.where, self.reason = where, reason


def promql_error(expression: str) -> str | None:
    """Why ``expression`` is not PromQL; None when it parses."""
    if not expression.strip():
        return "empty expression"
    try:
        promql_parser.parse(expression)
    except (ValueError, RuntimeError) as exc:
        return f"PromQL does not parse: {' '.join(str(exc).split())}"
    return None


def _promql(expression: str, where: str) -> None:
    filled = _RANGE_PLACEHOLDER.sub("[5m]", expression)
    filled = _MATCHER_PLACEHOLDER.sub('placeholder="x"', filled)
    reason = promql_error(filled)
    if reason is not None:
        raise Problem(where, reason)


def _documents(text: str) -> list[Any]:
    """The documents of a generated YAML file, read as any config is (with its bounds)."""
    try:
        return layer.parse_all(text, "")
    except layer.ConfigError as exc:
        where, _, reason = str(exc).removeprefix(": ").partition(": ")
        raise Problem(where, reason) from None


def _walk(value: Any, where: str) -> Iterator[tuple[str, str, Any]]:
    """(path, key, value) of every mapping entry and list item under ``value`` (an item's
    key is "")."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            yield path, str(key), item
            yield from _walk(item, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield f"{where}[{index}]", "", item
            yield from _walk(item, f"{where}[{index}]")


def _check_strings(document: Any) -> None:
    """No control character but line breaks and tabs (which expressions and descriptions
    hold) in any value: a NUL or an escape sequence reaches whoever reads the file."""
    for path, _, value in _walk(document, ""):
        if isinstance(value, str) and any(not c.isprintable() and c not in "\n\t" for c in value):
            raise Problem(path, f"control character in {value!r}")


def _yaml(text: str) -> None:
    """YAML that parses, with each PromQL value parsing too."""
    for index, document in enumerate(_documents(text)):
        prefix = f"document {index + 1}" if index else ""
        for path, key, value in _walk(document, prefix):
            if key in _PROMQL_KEYS and isinstance(value, str):
                _promql(value, path)


def _rule_groups(groups: Any, where: str) -> None:
    """Prometheus' rule-file format, as ``promtool check rules`` reads it."""
    if not isinstance(groups, list) or not groups:
        raise Problem(where, "expected a non-empty list of rule groups")
    names: set[str] = set()
    for g, group in enumerate(groups):
        at = f"{where}[{g}]"
        if not isinstance(group, Mapping) or not isinstance(group.get("name"), str):
            raise Problem(at, "expected a group with a name")
        if group["name"] in names:
            raise Problem(f"{at}.name", f"group {group['name']!r} is defined twice")
        names.add(group["name"])
        for r, rule in enumerate(group.get("rules") or []):
            _rule(rule, f"{at}.rules[{r}]")


def _rule(rule: Any, at: str) -> None:
    if not isinstance(rule, Mapping) or ("record" in rule) == ("alert" in rule):
        raise Problem(at, "expected exactly one of record or alert")
    name = rule.get("record", rule.get("alert"))
    if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
        raise Problem(at, f"{name!r} is not a valid rule name")
    if not isinstance(rule.get("expr"), str):
        raise Problem(f"{at}.expr", "expected a PromQL expression")
    _promql(rule["expr"], f"{at}.expr")
    if "for" in rule:
        try:
            Duration.parse(str(rule["for"]))
        except ValueError as exc:
            raise Problem(f"{at}.for", str(exc)) from None
    for field in ("labels", "annotations"):
        values = rule.get(field) or {}
        if not isinstance(values, Mapping):
            raise Problem(f"{at}.{field}", "expected a mapping")
        for key, value in values.items():
            if not isinstance(key, str) or not _LABEL_NAME.fullmatch(key):
                raise Problem(f"{at}.{field}", f"{key!r} is not a valid label name")
            if not isinstance(value, str):
                raise Problem(f"{at}.{field}.{key}", "expected a string")
            reason = gotemplate.error(value)
            if reason is not None:
                raise Problem(f"{at}.{field}.{key}", f"template does not parse: {reason}")


def _rules_file(text: str) -> None:
    documents = _documents(text)
    if len(documents) != 1 or not isinstance(documents[0], Mapping):
        raise Problem("", "expected one mapping with groups")
    _check_strings(documents[0])
    _rule_groups(documents[0].get("groups"), "groups")


def _prometheus_rule(text: str) -> None:
    documents = _documents(text)
    if len(documents) != 1 or not isinstance(documents[0], Mapping):
        raise Problem("", "expected one PrometheusRule")
    _check_strings(documents[0])
    _rule_groups((documents[0].get("spec") or {}).get("groups"), "spec.groups")
    _yaml(text)


def _rules_of(text: str) -> str:
    """The rule file inside a PrometheusRule, for promtool."""
    return yaml.safe_dump({"groups": layer.parse(text, "")["spec"]["groups"]})


_MATCHER = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*')


def _alertmanager(text: str) -> None:
    """The Alertmanager config we write: routes, matchers, receivers, webhook URLs."""
    documents = _documents(text)
    if len(documents) != 1 or not isinstance(documents[0], Mapping):
        raise Problem("", "expected one mapping")
    document = documents[0]
    _check_strings(document)
    receivers = [r.get("name") for r in document.get("receivers") or [] if isinstance(r, dict)]
    if len(set(receivers)) != len(receivers):
        raise Problem("receivers", "a receiver name is used twice")
    for path, key, value in _walk(document, ""):
        if key in ("matchers", "source_matchers", "target_matchers"):
            for index, matcher in enumerate(value or []):
                if not isinstance(matcher, str) or not _MATCHER.fullmatch(matcher):
                    raise Problem(f"{path}[{index}]", f"not a matcher: {matcher!r}")
        elif key == "receiver" and value not in receivers:
            raise Problem(path, f"no receiver named {value!r}")
        elif key in ("group_wait", "group_interval", "repeat_interval"):
            try:
                Duration.parse(str(value))
            except ValueError as exc:
                raise Problem(path, str(exc)) from None
        elif key == "url":
            _url(value, path)


def _url(value: Any, where: str) -> None:
    match = _URL.fullmatch(str(value))
    if match is None:
        raise Problem(where, f"not an http(s) URL: {value!r}")
    try:
        host_port(f"{match[1]}:{match[2] or 80}")
    except ValueError as exc:
        raise Problem(where, str(exc)) from None


def _dashboard(text: str) -> None:
    """Grafana dashboard JSON: it parses, and every panel query is PromQL."""
    try:
        board = json.loads(text)
    except ValueError as exc:
        raise Problem("", f"not JSON: {exc}") from None
    for path, key, value in _walk(board, ""):
        if key == "targets" and isinstance(value, list):
            for index, target in enumerate(value):
                if isinstance(target, Mapping) and isinstance(target.get("expr"), str):
                    ranged = _RANGE_PLACEHOLDER.sub("[5m]", target["expr"])
                    _promql(_GRAFANA_VARIABLE.sub("x", ranged), f"{path}[{index}].expr")


def _text(text: str) -> None:
    """Pages such as the docs tables: text with no control characters beyond line breaks."""
    for number, line in enumerate(text.splitlines(), 1):
        if any(not c.isprintable() and c != "\t" for c in line):
            raise Problem(f"line {number}", "control character")


#: a Prometheus rule file (promtool check rules)
RULES = Kind(_rules_file, Tool(("promtool", "check", "rules")))
#: a PrometheusRule resource: its groups are a rule file
PROMETHEUS_RULE = Kind(_prometheus_rule, Tool(("promtool", "check", "rules"), _rules_of))
#: an Alertmanager config (amtool check-config)
ALERTMANAGER = Kind(_alertmanager, Tool(("amtool", "check-config")))
#: other YAML: Kubernetes manifests, values files, Argo and Flagger templates
YAML = Kind(_yaml)
#: a Grafana dashboard's JSON
DASHBOARD = Kind(_dashboard)
#: Markdown and other text
TEXT = Kind(_text)


def _scrape_config(text: str) -> None:
    _yaml(text)
    documents = _documents(text)
    first = documents[0] if len(documents) == 1 else None
    jobs = first.get("scrape_configs") if isinstance(first, dict) else None
    if not isinstance(jobs, list) or not jobs:
        raise Problem("scrape_configs", "a list of scrape jobs is required")


#: a Prometheus-format scrape config as vmagent reads it (``vmagent -dryRun``: it parses and
#: checks the file, then exits)
SCRAPE_CONFIG = Kind(_scrape_config, Tool(("vmagent", "-dryRun", "-promscrape.config")))


def kind_of(name: str, kinds: Mapping[str, Kind]) -> Kind:
    """The kind of the first pattern in ``kinds`` that ``name`` matches."""
    for pattern, kind in kinds.items():
        if fnmatch(name, pattern):
            return kind
    raise AssertionError(f"no kind declared for generated file {name}")


def check(files: Mapping[str, str], kinds: Mapping[str, Kind]) -> list[str]:
    """Check every file; raise :class:`Invalid` for the first that fails. Returns the
    external checks that did not run (their tool is not on PATH)."""
    typed = {name: kind_of(name, kinds) for name in files}
    for name, text in files.items():
        try:
            typed[name].check(text)
        except Problem as problem:
            raise Invalid(name, problem.where, problem.reason) from None
    tools = {kind.tool for kind in typed.values() if kind.tool is not None}
    missing = sorted({tool.name for tool in tools if shutil.which(tool.argv[0]) is None})
    with tempfile.TemporaryDirectory(prefix="inferwatch-check-") as folder:
        for name, text in files.items():
            tool = typed[name].tool
            if tool is not None and tool.name not in missing:
                _run(tool, name, text, Path(folder))
    return missing


def _run(tool: Tool, name: str, text: str, folder: Path) -> None:
    copy = folder / name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(tool.prepare(text), encoding="utf-8")
    try:
        done = subprocess.run(
            [*tool.argv, str(copy)],
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise Invalid(name, "", f"{tool.name} did not finish in {TOOL_TIMEOUT}s") from None
    if done.returncode != 0:
        output = (done.stderr + "\n" + done.stdout).replace(str(copy), name)
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        found = [line for line in lines if "FAILED" not in line and "NOTICE" not in line]
        raise Invalid(name, "", f"{tool.name}: {(found or lines or ['failed'])[-1]}")


def unchecked_line(missing: list[str]) -> str:
    """The one line a command prints for the external checks that did not run."""
    return f"not checked by {', '.join(missing)}: not on PATH (the Python checks ran)"
