"""The generated HAProxy config: committed copy fresh, accepted by the real haproxy, bad
topologies refused with one line."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from inferwatch.cli import main as cli
from inferwatch.gateway import haproxy as gateway

pytestmark = pytest.mark.proc

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "deploy" / "haproxy" / "demo.cfg"


def _topology(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "listen": "127.0.0.1:8080",
        "runtime": "127.0.0.1:9999",
        "models": {
            "org/big": {
                "fallback": "org/small",
                "replicas": [
                    {"name": "big-1", "version": "v1", "address": "127.0.0.1:7001",
                     "check_port": 7101, "weight": 90},
                    {"name": "big-2", "version": "v2.rc1", "address": "127.0.0.1:7002",
                     "check_port": 7102, "weight": 10},
                ],
            },
            "org/small": {
                "replicas": [
                    {"name": "small-1", "version": "v1", "address": "127.0.0.1:7003",
                     "check_port": 7103},
                ],
            },
        },
    }  # fmt: skip
    document.update(changes)
    return document


def test_committed_demo_config_is_fresh() -> None:
    result = CliRunner().invoke(cli, ["generate", "gateway", "--out", str(EXAMPLE), "--check"])
    assert result.exit_code == 0, result.output
    assert EXAMPLE.read_text(encoding="utf-8").startswith(gateway.MARKER + "\n")


def test_check_fails_on_a_stale_config(tmp_path: Path) -> None:
    stale = tmp_path / "haproxy.cfg"
    stale.write_text(EXAMPLE.read_text(encoding="utf-8").replace("weight 67", "weight 66"))
    result = CliRunner().invoke(cli, ["generate", "gateway", "--out", str(stale), "--check"])
    assert result.exit_code == 1
    assert "stale" in result.output


def test_demo_and_custom_configs_pass_haproxy_check(haproxy_bin: str, tmp_path: Path) -> None:
    topology = tmp_path / "topology.yaml"
    topology.write_text(yaml.safe_dump(_topology()))
    custom = tmp_path / "custom.cfg"
    result = CliRunner().invoke(
        cli, ["generate", "gateway", "--topology", str(topology), "--out", str(custom)]
    )
    assert result.exit_code == 0, result.output
    for path in (EXAMPLE, custom):
        check = subprocess.run(
            [haproxy_bin, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30
        )
        assert check.returncode == 0, check.stdout + check.stderr
    text = custom.read_text(encoding="utf-8")
    # the pieces the gateway promises, spelled as HAProxy reads them
    # a refused connection takes the replica out at once; only a request that got nothing
    # back is retried
    assert "server v1:big-1 127.0.0.1:7001 weight 90 check port 7101 " \
        "observe layer4 error-limit 1 on-error mark-down" in text
    assert "    retry-on conn-failure empty-response\n" in text
    opened = text.split("\nbackend m_org_2fbig_open\n")[1].split("\n\n")[0]
    assert "server open:big-1" in opened and "observe" not in opened, "no check, no mark-down"
    assert "server fallback:small-1 127.0.0.1:7003 weight 0 track m_org_2fsmall/v1:small-1" in text
    assert "use_backend m_org_2fsmall if { var(txn.model) -m str org/big } " \
        "{ nbsrv(m_org_2fbig) lt 1 }" in text
    assert "stats socket ipv4@127.0.0.1:9999 mode 600 level admin" in text


def test_output_is_deterministic_and_ordered_as_the_topology() -> None:
    first = gateway.render(gateway.parse(_topology()))
    assert first == gateway.render(gateway.parse(_topology()))
    assert first.index("server v1:big-1") < first.index("server v2.rc1:big-2")


def _with_replica(**changes: Any) -> dict[str, Any]:
    document = _topology()
    document["models"]["org/small"]["replicas"][0].update(changes)
    return document


SMALL = "models.org/small.replicas[0]"
BAD = {
    "no models": (_topology(models={}), "models: expected a mapping of model name"),
    "unknown key": (_topology(listeners=1), "listeners: unknown field (expected one of"),
    "missing key": (
        {k: v for k, v in _topology().items() if k != "runtime"}, "runtime: is required"
    ),
    "bad listen": (_topology(listen="8080"), "listen: expected host:port, got '8080'"),
    "runtime path with space": (_topology(runtime="/tmp/a b.sock"), "runtime: unix socket path"),
    "weight too big": (_with_replica(weight=1000), f"{SMALL}.weight: expected an integer from"),
    "weight not int": (_with_replica(weight="heavy"), f"{SMALL}.weight: expected an integer"),
    "bad check port": (
        _with_replica(check_port=70000), f"{SMALL}.check_port: expected an integer from 1 to"
    ),
    "reserved version": (_with_replica(version="fallback"), f"{SMALL}.version: 'fallback' is"),
    "version with colon": (_with_replica(version="v:1"), f"{SMALL}.version: expected a name"),
    "replica not a mapping": (
        _topology(models={"m": {"replicas": ["r1"]}}), "models.m.replicas[0]: expected a mapping"
    ),
    "model with brace": (
        _topology(models={"a}b": {"replicas": []}}), "models.a}b: a model name is"
    ),
    "fallback unknown": (
        _topology(models={**_topology()["models"], "org/big": {
            **_topology()["models"]["org/big"], "fallback": "nope"}}),
        "models.org/big.fallback: 'nope' is not another model",
    ),
    "not a mapping": ([1, 2], "top level: expected a mapping, got a list"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_topology_is_one_clear_line(name: str, tmp_path: Path) -> None:
    document, words = BAD[name]
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(cli, ["generate", "gateway", "--topology", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: {words}"), lines


def test_unreadable_yaml_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text("models: [unclosed\n")
    result = CliRunner().invoke(cli, ["generate", "gateway", "--topology", str(path)])
    assert result.exit_code == 2
    assert "invalid YAML" in result.output and "Traceback" not in result.output


def test_the_documented_topology_is_the_demo_fleet() -> None:
    """The example topology file in docs/gateway.md renders exactly the committed demo config."""
    page = (REPO / "docs" / "gateway.md").read_text(encoding="utf-8")
    example = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert gateway.render(gateway.parse(yaml.safe_load(example))) == EXAMPLE.read_text("utf-8")
