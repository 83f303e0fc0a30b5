"""Proxy configuration: a full file loads, and every mistake names file, field and reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.proxy.config import ConfigError, load, parse
from inferwatch.proxy.tenants import hash_key

pytestmark = pytest.mark.unit

FULL = f"""
upstream:
  url: http://engine:8000
  read_timeout: 2m
  continuous_usage: true
identity:
  tenant_header: X-Team
  trusted_sources: [10.0.0.0/8, 192.168.1.7]
  unknown: attribute
tenants:
  acme:
    key_sha256: [{hash_key("sk-acme")}]
    priority: high
    max_concurrency: 4
    budget: {{tokens: 100000, window: 1h}}
labels: {{max_tenants: 20, tenant_idle: 10m}}
versions: {{engine_version: 0.33.0, prompt_version: p1}}
prices:
  default: {{prompt: 0.5, completion: 1.5}}
  models:
    big: {{prompt: 3, cached_prompt: 0.3, completion: 15}}
limits: {{max_input_tokens: 8192, max_concurrency: 64, queue_timeout: 5s}}
"""


def test_a_full_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(FULL)
    config = load(path)
    assert config.read_timeout_s == 120
    assert config.tenant_header == "x-team"
    assert config.key_index == {hash_key("sk-acme"): "acme"}
    acme = config.tenants["acme"]
    assert acme.priority == 0 and acme.budget is not None and acme.budget.window_seconds == 3600
    assert config.tenant_idle_seconds == 600
    assert config.price("big").cost(1_000_000, 400_000, 1_000_000) == pytest.approx(
        0.6 * 3 + 0.4 * 0.3 + 15
    )
    assert config.price("other-model").prompt == 0.5
    assert config.price("other-model").cached_prompt == 0.5  # defaults to the prompt price


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"upstream": {"url": "https://x"}}, r"upstream\.url: expected http://"),
        ({"upstream": {"timeout": 3}}, r"upstream\.timeout: unknown field"),
        (
            {"identity": {"trusted_sources": ["10.0.0.300/8"]}},
            r"identity\.trusted_sources\[0\]: '10\.0\.0\.300/8' is not an IP",
        ),
        ({"identity": {"unknown": "allow"}}, r"identity\.unknown: expected reject or attribute"),
        (
            {"tenants": {"acme": {"key_sha256": ["sk-plaintext"]}}},
            r"tenants\.acme\.key_sha256: expected 64-char lowercase hex",
        ),
        ({"tenants": {"other": {}}}, r"tenants\.other: tenant name 'other' is reserved"),
        (
            {"tenants": {"a": {"budget": {"tokens": 10, "window": "soon"}}}},
            r"tenants\.a\.budget\.window: expected a duration",
        ),
        ({"tenants": {"a": {"priority": "urgent"}}}, r"tenants\.a\.priority: expected one of"),
        (
            {
                "tenants": {
                    "a": {"key_sha256": [hash_key("k")]},
                    "b": {"key_sha256": [hash_key("k")]},
                }
            },
            r"tenants\.b\.key_sha256: key hash also belongs to 'a'",
        ),
        ({"limits": {"max_input_tokens": -1}}, r"limits\.max_input_tokens: expected an integer"),
        (
            {"prices": {"models": {"m": {"completion": "cheap"}}}},
            r"prices\.models\.m\.completion: expected a number",
        ),
        ([1, 2], r"top level: expected a mapping"),
    ],
)
def test_mistakes_name_the_file_field_and_reason(document: object, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^proxy\.yaml: " + message):
        parse(document, "proxy.yaml")


def test_the_cli_reports_a_bad_config_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("tenants:\n  acme: {priority: urgent}\n")
    result = CliRunner().invoke(main, ["proxy", "--config", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"Error: {path}: tenants.acme.priority: expected one of "
        "['high', 'low', 'normal'], got 'urgent'"
    ]
    path.write_text("tenants: [unclosed\n")
    result = CliRunner().invoke(main, ["proxy", "--config", str(path)])
    assert result.exit_code == 2 and "line 2: invalid YAML" in result.output


def test_flags_have_environment_twins() -> None:
    result = CliRunner().invoke(main, ["proxy", "--help"])
    assert "INFERWATCH_PROXY_CONFIG" in result.output
    assert "INFERWATCH_PROXY_UPSTREAM" in result.output
