"""Generators trust no config: a hostile one exits 2 with one line and writes nothing.

These run the Python checks only (PATH holds no promtool, amtool or haproxy here, which is
also how a plain pip install runs); the same configs against the real tools are in
``test_trust_generators_tools.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.gateway import haproxycfg
from inferwatch.mixin import files, gotemplate, validate

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("no_external_checkers")]

REPO = Path(__file__).resolve().parents[1]
WEBHOOK = "http://127.0.0.1:9405/webhook"


def _generate(
    tmp_path: Path, command: str, config: str, flag: str = "--config"
) -> tuple[int, str, Path]:
    source = tmp_path / "config.yaml"
    source.write_text(config, encoding="utf-8")
    out = tmp_path / "out"
    target = out / "haproxy.cfg" if command == "gateway" else out
    result = CliRunner().invoke(
        main, ["generate", command, flag, str(source), "--out", str(target)]
    )
    return result.exit_code, result.output, out


def _refused(tmp_path: Path, command: str, config: str, reason: str, flag: str = "--config") -> str:
    code, output, out = _generate(tmp_path, command, config, flag)
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert reason in lines[0], lines[0]
    assert "Traceback" not in output
    assert not out.exists() or not any(out.rglob("*")), sorted(out.rglob("*"))
    return lines[0]


def _alias_bomb() -> str:
    """20 KB of config: one long webhook URL, repeated through aliases into the receivers."""
    url = WEBHOOK + "?" + "x" * 18_000
    aliases = ", ".join(["*u"] * 30)
    lines = ["alertmanager:", "  receivers:", f"    page: [&u {url}, {aliases}]",
             f"    ticket: [{aliases}]"]  # fmt: skip
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_in_an_alerts_config_writes_nothing(tmp_path: Path) -> None:
    """Once 20 KB of config made a 16 MB alertmanager.yaml."""
    bomb = _alias_bomb()
    assert len(bomb) < 20_500
    line = _refused(tmp_path, "alerts", bomb, "aliases expand to more than")
    assert "config.yaml: line 3" in line


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ("slo:\n  traffic_floor: " + "9" * 400 + "\n", "integer larger than"),
        ("selectors: " + "{k: " * 5000 + "1" + "}" * 5000 + "\n", "nested deeper"),
        ("alerts:\n  InferwatchEngineDown:\n    for: 9999999999y\n", "is longer than the 10y"),
        (
            "alerts:\n  InferwatchEngineDown:\n    annotations:\n      extra: '{{ .Broken'\n",
            "alerts.InferwatchEngineDown.annotations.extra: not a template Prometheus can parse",
        ),
        (
            "alerts:\n  InferwatchEngineDown:\n    labels:\n      team: '{{ end }}'\n",
            "alerts.InferwatchEngineDown.labels.team: not a template",
        ),
        (
            'selectors:\n  sidecar: "job=\\"a\\nb\\""\n',
            "selectors.sidecar: expected label matchers",
        ),
        ('selectors:\n  proxy: "job=~\\"(\\""\n', "selectors.proxy: PromQL does not parse"),
        ('latency:\n  models:\n    "a\\nb": {ttft: {warning: 1.0}}\n', "latency.models.a\\nb"),
        (
            'alerts:\n  InferwatchCostPer1kTokensDrift:\n    baselines: {"m\\u0000": 1.0}\n',
            "a model name is printable text",
        ),
        (
            "alertmanager:\n  receivers:\n    page: ['http://999.999.999.999:9/x']\n",
            "alertmanager.receivers.page[0]: expected host:port",
        ),
    ],
    ids=[
        "400-digit integer",
        "5000-deep mapping",
        "for 9999999999y",
        "broken annotation",
        "broken label template",
        "newline in selector",
        "selector regex",
        "newline in model",
        "NUL in cost model",
        "bad webhook address",
    ],
)
@pytest.mark.parametrize("command", ["alerts", "dashboards", "canary"])
def test_a_hostile_alerts_config_is_one_line_and_writes_nothing(
    tmp_path: Path, command: str, config: str, reason: str
) -> None:
    assert reason in _refused(tmp_path, command, config, reason)


def _topology(address: str = "127.0.0.1:7001", name: str = "m") -> str:
    return yaml.safe_dump({
        "listen": "127.0.0.1:8080", "runtime": "127.0.0.1:9999",
        "models": {name: {"replicas": [
            {"name": "r1", "version": "v1", "address": address, "check_port": 7101}]}},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("999.999.999.999:7001", "'999.999.999.999' is not an IPv4 address"),
        ("1.2.3:7001", "'1.2.3' is not an IPv4 address"),
        ("[::zz]:7001", "is not an IPv4 address, [IPv6] address or DNS name"),
        ("host_name:7001", "is not an IPv4 address"),
        ("127.0.0.1:0", "a port from 1 to 65535"),
        ("127.0.0.1:7001\n", "expected host:port"),
    ],
)
def test_a_topology_address_must_be_an_address(tmp_path: Path, address: str, reason: str) -> None:
    line = _refused(tmp_path, "gateway", _topology(address), reason, "--topology")
    assert "models.m.replicas[0].address" in line


def test_a_model_name_with_a_newline_never_reaches_haproxy_cfg(tmp_path: Path) -> None:
    line = _refused(tmp_path, "gateway", _topology(name="a\nb"), "a model name is", "--topology")
    assert "\n" not in line


def test_a_plain_install_is_told_which_checks_did_not_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["generate", "alerts", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().splitlines() == [
        validate.unchecked_line(["amtool check-config", "promtool check rules"])
    ]
    assert (tmp_path / "out" / "alertmanager" / "alertmanager.yaml").is_file()


def test_one_invalid_file_keeps_the_whole_set_unwritten(tmp_path: Path) -> None:
    kinds = {"*.json": validate.DASHBOARD, "*.yaml": validate.RULES}
    good = {"groups": [{"name": "g", "rules": [{"record": "a:b", "expr": "sum(x)"}]}]}
    bad = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "sum(x"}]}]}
    fileset = {"a.json": "{}", "b.yaml": files.dump(good), "c.yaml": files.dump(bad)}
    with pytest.raises(validate.Invalid, match=r"^c\.yaml: groups\[0\]\.rules\[0\]\.expr: "):
        files.write(tmp_path / "out", fileset, kinds)
    assert not (tmp_path / "out").exists()
    fileset.pop("c.yaml")
    written = files.write(tmp_path / "out", fileset, kinds)
    assert sorted(written.changed) == ["a.json", "b.yaml"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.json", "b.yaml"]


def _rules(**rule: object) -> str:
    return files.dump({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", **rule}]}]})


@pytest.mark.parametrize(
    ("kind", "text", "reason"),
    [
        (validate.RULES, _rules(expr="rate(x[5m]"), "PromQL does not parse"),
        (validate.RULES, _rules(expr='x{a="1\n2"}'), "PromQL does not parse"),
        (validate.RULES, _rules(annotations={"s": "{{ .Broken"}), "template does not parse"),
        (validate.RULES, _rules(labels={"bad-name": "x"}), "not a valid label name"),
        (validate.RULES, _rules(alert="A B"), "not a valid rule name"),
        (validate.RULES, _rules(**{"for": "1.5m"}), "expected a duration"),
        (validate.RULES, "groups: [\n", "invalid YAML"),
        (validate.ALERTMANAGER, "route: {receiver: x}\nreceivers: [{name: y}]\n", "no receiver"),
        (
            validate.ALERTMANAGER,
            "route: {receiver: y, matchers: ['a=\"b']}\nreceivers: [{name: y}]\n",
            "not a matcher",
        ),
        (validate.DASHBOARD, '{"panels": [{"targets": [{"expr": "sum(("}]}]}', "PromQL"),
        (validate.DASHBOARD, '{"panels": [', "not JSON"),
        (validate.YAML, "spec: {query: 'sum(x{a=\"b\"}'}\n", "spec.query: PromQL"),
    ],
)
def test_each_kind_refuses_what_its_consumer_would(
    kind: validate.Kind, text: str, reason: str
) -> None:
    with pytest.raises(validate.Invalid, match=reason) as raised:
        validate.check({"f": text}, {"*": kind})
    assert "\n" not in str(raised.value)


HAPROXY = (REPO / "deploy" / "haproxy" / "demo.cfg").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        ("server v1:primary-v1 ", "server v1:primary\n-v1 ", "expected server NAME ADDRESS"),
        ("server v1:primary-v1 ", "server v1:prim#ary-v1 ", "characters HAProxy refuses"),
        ("server v1:primary-v1 ", "server v2-fp8:primary-v2 ", "defined twice"),
        ("127.0.0.1:18", "999.999.999.999:18", "'999.999.999.999' is not an IPv4 address"),
        ("backend m_", "backend m\tx_", "control character"),
        ("default_backend m_", "default_backend nowhere_", "is not defined"),
        ("    mode http", "  mode http", "indented by four spaces"),
        ("code\":502}}'", 'code":502}}', "unclosed quote"),
    ],
)
def test_haproxy_cfg_grammar_refuses_what_haproxy_would(old: str, new: str, reason: str) -> None:
    assert old in HAPROXY
    with pytest.raises(validate.Invalid, match=reason):
        validate.check({"haproxy.cfg": HAPROXY.replace(old, new, 1)}, {"*": haproxycfg.KIND})


def test_every_committed_generated_file_passes_the_python_checks() -> None:
    from inferwatch.alerts import slo_specs
    from inferwatch.alerts import writer as alerts
    from inferwatch.dashboards import writer as dashboards
    from inferwatch.k8s import kit

    folders = {
        REPO / "alerts" / "generated": alerts.KINDS,
        REPO / "alerts" / "generated" / "slo": slo_specs.KINDS,
        REPO / "dashboards" / "generated": dashboards.KINDS,
        REPO / "deploy" / "canary": {"*.yaml": validate.YAML},
        REPO / "deploy" / "kubernetes": kit.KINDS,
    }
    for folder, kinds in folders.items():
        # a folder inside another is its own generator's output, checked as its own
        others = [other for other in folders if other != folder and other.is_relative_to(folder)]
        found = {str(p.relative_to(folder)): p.read_text(encoding="utf-8")
                 for p in folder.rglob("*") if p.suffix in (".yaml", ".json")
                 and not any(p.is_relative_to(other) for other in others)}  # fmt: skip
        assert found, folder
        validate.check(found, kinds)
    assert validate.check({"demo.cfg": HAPROXY}, {"*": haproxycfg.KIND}) == ["haproxy -c -f"]


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{{ $labels.model }} at {{ $value | humanize }}", None),
        ("{{ if gt $value 1.0 }}high{{ else }}low{{ end }}{{/* why */}}", None),
        ("{{- range $k, $v := $labels }}{{ $k }}={{ $v }} {{ end -}}", None),
        ('{{ printf "%.2f" $value }} {{ "}}" }}', None),
        ("{{ .Broken", "unclosed action"),
        ("{{ if $value }}x", "has no {{end}}"),
        ("{{ end }}", "unexpected {{end}}"),
        ("{{ else }}", "unexpected {{else}}"),
        ("{{}}", "missing value"),
        ("{{ nosuch $value }}", 'function "nosuch" not defined'),
        ("{{ (humanize $value }}", "unclosed left paren"),
        ('{{ "open }}', "unclosed action"),
        ("{{ | humanize }}", "missing command"),
        ("{{ $undeclared }}", "undefined variable"),
        ("{{ break }}", "outside range"),
        ("{{/* open }}", "unclosed comment"),
    ],
)
def test_go_template_syntax(template: str, reason: str | None) -> None:
    found = gotemplate.error(template)
    assert (found is None) if reason is None else (found is not None and reason in found), found


def test_the_haproxy_copy_resolves_here_whatever_the_names() -> None:
    text = ("global\n    stats socket ipv4@gw.internal:9999 mode 600\n"
            "    stats socket /run/haproxy.sock mode 600\nbackend b\n"
            "    server v1:r1 replica-1.svc:8000 check port 9400\n"
            "    bind [::1]:80\n    bind gw.internal:80\n")  # fmt: skip
    copy = haproxycfg.resolvable(text)
    assert "stats socket ipv4@127.0.0.1:9999 mode 600" in copy
    assert "stats socket /run/haproxy.sock mode 600" in copy
    assert "server v1:r1 127.0.0.1:8000 check port 9400" in copy
    assert "bind [::1]:80\n    bind 127.0.0.1:80\n" in copy
