"""Hostile configs against the real consumers: a generator either exits 0 and every file it
wrote passes promtool, amtool or ``haproxy -c``, or exits 2 with one line and writes nothing.

The tools are run here by the test itself on what was written, not through the generator's
own checks, so the property holds for what Prometheus, Alertmanager and HAProxy would load.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from inferwatch.cli import main
from inferwatch.mixin import files, gotemplate
from support.shared import tool

pytestmark = pytest.mark.proc

HOSTILE = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
#: characters that break PromQL, YAML, Go templates or a config line
NASTY = st.text(
    alphabet=st.sampled_from(list("{}$.|\"'`\\\n\t #:=~!()[],-_aZ09\x00\u2028")), max_size=24
)
TEXT = st.one_of(st.text(max_size=24), NASTY)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _outcome(argv: list[str], out: Path) -> bool:
    """Runs a generator into a fresh ``out``; True when it wrote (exit 0), False when it
    refused (exit 2, one line, nothing written)."""
    shutil.rmtree(out, ignore_errors=True)
    result = CliRunner().invoke(main, argv)
    event(f"exit {result.exit_code}")
    if result.exit_code == 0:
        return True
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*")), result.output
    return False


MATCHER = st.builds(
    lambda name, op, value: f'{name}{op}"{value}"',
    st.sampled_from(["job", "namespace", "a b", "0x", ""]),
    st.sampled_from(["=", "!=", "=~", "!~", "=="]),
    st.one_of(st.sampled_from(["serving", ".*llm.*", "a|b"]), TEXT),
)
DURATION = st.one_of(
    TEXT,
    st.builds(
        lambda n, unit: f"{n}{unit}",
        st.integers(0, 10**12),
        st.sampled_from(["ms", "s", "m", "h", "d", "w", "y", "mo"]),
    ),
)
ANNOTATION = st.one_of(
    TEXT, st.sampled_from(["{{ $labels.model }} is down", "{{ $value | humanize }}", "plain"])
)
MODEL = st.one_of(TEXT, st.sampled_from(["Qwen/Qwen2.5-7B-Instruct", "m:1@b+c", "a.b"]))
#: where a hostile value goes, and what it is drawn from; each example sets one or two
LEAVES: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("selectors", "sidecar"): st.one_of(MATCHER, TEXT),
    ("selectors", "proxy"): MATCHER,
    ("slo", "traffic_floor"): st.one_of(st.integers(-(10**30), 10**30), st.floats()),
    ("latency", "models"): st.builds(lambda m: {m: {"ttft": {"warning": 1.0}}}, MODEL),
    ("alerts", "InferwatchEngineDown", "for"): DURATION,
    ("alerts", "InferwatchEngineDown", "annotations"): st.builds(
        lambda a: {"extra": a}, ANNOTATION
    ),
    ("alerts", "InferwatchEngineDown", "labels"): st.builds(lambda a: {"team": a}, ANNOTATION),
    ("alerts", "InferwatchCostPer1kTokensDrift", "baselines"): st.builds(lambda m: {m: 0.5}, MODEL),
    ("alertmanager", "receivers", "page"): st.builds(
        lambda host, port: [f"http://{host}:{port}/x"],
        st.one_of(TEXT, st.sampled_from(["pager.example.com", "10.0.0.1", "999.1.1.1"])),
        st.integers(0, 70000),
    ),
}


@st.composite
def alerts_config(draw: st.DrawFn) -> dict[str, Any]:
    """An alerts config with one or two of its fields drawn from hostile values."""
    document: dict[str, Any] = {}
    for path in draw(st.lists(st.sampled_from(sorted(LEAVES)), min_size=1, max_size=2)):
        *parents, leaf = path
        node = document
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = draw(LEAVES[path])
    return document


@HOSTILE
@given(document=alerts_config())
@example(document={})
@example(document={"alerts": {"InferwatchEngineDown": {"annotations": {"x": "{{ .Broken"}}}})
@example(document={"latency": {"models": {"a\nb": {"ttft": {"warning": 1.0}}}}})
def test_generate_alerts_on_a_hostile_config(
    tmp_path: Path, promtool: str, amtool: str, document: dict[str, Any]
) -> None:
    source, out = tmp_path / "alerts.yaml", tmp_path / "out"
    source.write_text(yaml.safe_dump(document), encoding="utf-8")
    if _outcome(["generate", "alerts", "--config", str(source), "--out", str(out)], out):
        rules = sorted(str(p) for p in out.glob("*.yaml"))
        checked = _run(promtool, "check", "rules", *rules)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        manager = _run(amtool, "check-config", str(out / "alertmanager" / "alertmanager.yaml"))
        assert manager.returncode == 0, manager.stdout + manager.stderr


@HOSTILE
@given(document=alerts_config(), command=st.sampled_from(["dashboards", "canary"]))
def test_the_other_config_generators_on_a_hostile_config(
    tmp_path: Path, document: dict[str, Any], command: str
) -> None:
    """Dashboards and the canary templates read the same config: they refuse it or write
    files that parse (their consumers, Grafana and the rollout controllers, have no checker
    to run here)."""
    source, out = tmp_path / "alerts.yaml", tmp_path / f"out-{command}"
    source.write_text(yaml.safe_dump(document), encoding="utf-8")
    if _outcome(["generate", command, "--config", str(source), "--out", str(out)], out):
        for path in out.rglob("*.*"):
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".json":
                json.loads(text)
            else:
                assert list(yaml.safe_load_all(text))


ADDRESS = st.one_of(
    st.builds(
        lambda octets, port: ".".join(map(str, octets)) + f":{port}",
        st.lists(st.integers(0, 999), min_size=3, max_size=5),
        st.integers(0, 70000),
    ),
    st.builds(lambda host, port: f"{host}:{port}", TEXT, st.integers(1, 65535)),
    st.sampled_from(["[::1]:7001", "[::zz]:7001", "localhost:7001", "replica-1.svc:7001"]),
)
_HOST_NAME = re.compile(r"^(    (?:server \S+|bind)) ([A-Za-z][A-Za-z0-9.-]*):([0-9]+)", re.M)


NAME = st.one_of(TEXT, st.sampled_from(["v1", "replica-1", "qa.user_2"]))
#: a topology's fields that come from its author, with a valid value and hostile ones
TOPOLOGY = {
    "model": ("m", MODEL),
    "version": ("v1", NAME),
    "replica": ("r1", NAME),
    "users": ([], st.lists(NAME, max_size=2)),
    "address": ("127.0.0.1:7001", ADDRESS),
    "listen": ("127.0.0.1:8080", ADDRESS),
}


@st.composite
def topology_fields(draw: st.DrawFn) -> dict[str, Any]:
    """The valid topology with one or two of its fields drawn from hostile values."""
    chosen = draw(st.lists(st.sampled_from(sorted(TOPOLOGY)), min_size=1, max_size=2))
    return {
        field: draw(hostile) if field in chosen else valid
        for field, (valid, hostile) in TOPOLOGY.items()
    }


@HOSTILE
@given(fields=topology_fields())
@example(fields={field: valid for field, (valid, _) in TOPOLOGY.items()})
@example(fields={**{f: v for f, (v, _) in TOPOLOGY.items()}, "address": "replica-1.svc:7001"})
@example(fields={**{f: v for f, (v, _) in TOPOLOGY.items()}, "address": "999.999.999.999:7001"})
@example(fields={**{f: v for f, (v, _) in TOPOLOGY.items()}, "replica": "r\n1"})
def test_generate_gateway_on_a_hostile_topology(
    tmp_path: Path, haproxy_bin: str, fields: dict[str, Any]
) -> None:
    topology = {
        "listen": fields["listen"],
        "runtime": "127.0.0.1:9999",
        "models": {fields["model"]: {
            "replicas": [{"name": fields["replica"], "version": fields["version"],
                          "address": fields["address"], "check_port": 7101}],
            "canary": {"version": fields["version"], "users": fields["users"]},
        }},
    }  # fmt: skip
    source, out = tmp_path / "topology.yaml", tmp_path / "gw"
    source.write_text(yaml.safe_dump(topology), encoding="utf-8")
    cfg = out / "haproxy.cfg"
    argv = ["generate", "gateway", "--topology", str(source), "--out", str(cfg)]
    if _outcome(argv, out):
        # names resolve where HAProxy runs; here, they stand for loopback
        copy = tmp_path / "resolvable.cfg"
        copy.write_text(_HOST_NAME.sub(r"\1 127.0.0.1:\3", cfg.read_text(encoding="utf-8")))
        checked = _run(haproxy_bin, "-c", "-f", str(copy))
        assert checked.returncode == 0, checked.stdout + checked.stderr


TEMPLATES = [
    "{{ $labels.model }} at {{ $value | humanize }}",
    "{{ if gt $value 1.0 }}high{{ else if lt $value 0.5 }}low{{ else }}ok{{ end }}",
    "{{- range $k, $v := $labels }}{{ $k }}={{ $v }} {{ end -}}",
    '{{ printf "%.2f" $value }} {{ "}}" }} {{/* it\'s */}}',
    '{{ with $labels.a }}{{ . }}{{ end }} {{ index $labels "b" }}',
    "{{ .Broken",
    "{{ if $value }}x",
    "{{ end }}",
    "{{ else }}",
    "{{}}",
    "{{ nosuch $value }}",
    "{{ (humanize $value }}",
    '{{ "open }}',
    "{{ $value | }}",
    "{{/* open }}",
    "a }} b {{ $value }}",
    "{{ $value | humanize | }}",
    "{{ | humanize }}",
    "{{ $undeclared }}",
    "{{ $x := 1 }}{{ $x }}",
    "{{ $value := }}",
    "{{ break }}",
    "{{ range $i, $v := $labels }}{{ $i }}{{ break }}{{ end }}",
]


def test_the_go_template_check_agrees_with_promtool(tmp_path: Path, promtool: str) -> None:
    rule = {"alert": "A", "expr": "up == 0"}
    verdicts = {}
    for index, template in enumerate(TEMPLATES):
        path = tmp_path / f"t{index}.yaml"
        group = {"name": "g", "rules": [{**rule, "annotations": {"summary": template}}]}
        path.write_text(files.dump({"groups": [group]}))
        verdicts[template] = _run(promtool, "check", "rules", str(path)).returncode == 0
    ours = {template: gotemplate.error(template) is None for template in TEMPLATES}
    assert ours == verdicts


def test_a_checker_that_refuses_a_file_stops_the_whole_set(tmp_path: Path) -> None:
    """promtool's own verdict counts even where the Python checks passed."""
    tools = tmp_path / "bin"
    tools.mkdir()
    fake = tools / "promtool"
    fake.write_text('#!/bin/sh\necho "  FAILED:" >&2\necho "$3: 1:1: group \\"g\\": nope" >&2\n'
                    "exit 1\n")  # fmt: skip
    fake.chmod(0o755)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["generate", "alerts", "--out", str(out)], env={"PATH": f"{tools}:/usr/bin:/bin"}
    )
    assert result.exit_code == 2, result.output
    assert "promtool check rules: " in result.output and "nope" in result.output
    assert not out.exists()


KIT = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
#: a site's fields, with the valid value of the shipped east site and hostile ones
SITE = {
    ("namespace",): st.one_of(TEXT, st.just("llm")),
    ("cluster",): st.one_of(TEXT, st.just("west")),
    ("image_tag",): st.one_of(TEXT, st.just("1.2.3")),
    ("monitoring", "release"): TEXT,
    ("monitoring", "remote_write", "url"): st.one_of(
        TEXT, st.builds(lambda host: f"https://{host}/push", TEXT)
    ),
    ("monitoring", "remote_write", "batch_send_deadline"): DURATION,
    ("gateway", "hostname"): st.one_of(TEXT, st.just("llm.west.example.com")),
    ("gateway", "canary_users"): st.lists(NAME, max_size=2),
}


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@HOSTILE
@given(
    values=st.lists(
        st.sampled_from(sorted(SITE)).flatmap(lambda path: st.tuples(st.just(path), SITE[path])),
        min_size=1,
        max_size=2,
    )
)
@example(values=[(("cluster",), "west")])
@example(values=[(("gateway", "hostname"), "llm.example.com\nx")])
@example(values=[(("monitoring", "remote_write", "batch_send_deadline"), "9999999999y")])
def test_generate_k8s_on_a_hostile_site(
    tmp_path: Path, values: list[tuple[tuple[str, ...], Any]]
) -> None:
    kubectl = tool("kubectl")
    kit = tmp_path / "kit"
    shutil.rmtree(kit, ignore_errors=True)
    shutil.copytree(KIT, kit)
    site = yaml.safe_load((KIT / "sites" / "multi-cluster-east.yaml").read_text())
    for path, value in values:
        node = site
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    (kit / "sites" / "west.yaml").write_text(yaml.safe_dump(site), encoding="utf-8")
    before = _tree(kit)
    result = CliRunner().invoke(main, ["generate", "k8s", "--dir", str(kit)])
    event(f"exit {result.exit_code}")
    if result.exit_code == 0:
        rendered = _run(kubectl, "kustomize", str(kit / "overlays" / "west"))
        assert rendered.returncode == 0, rendered.stderr
        assert [d for d in yaml.safe_load_all(rendered.stdout) if d]
    else:
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
        assert len(lines) == 1 and "Traceback" not in result.output, result.output
        assert _tree(kit) == before
