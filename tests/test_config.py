"""The config layer: every class of bad input is one line, and every config goes through it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from inferwatch import config as layer
from inferwatch.config import Duration, DurationParam, Fields, loader
from inferwatch.config.schema import number_of
from inferwatch.gateway import haproxy
from inferwatch.k8s.site import SiteError, load_site
from inferwatch.mixin import config as alert_config
from inferwatch.proxy import config as proxy_config
from inferwatch.runbooks import config as runbooks_config

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("inferwatch", "exporters", "probes", "dashboards", "alerts", "runbooks")

LOADERS: dict[str, tuple[Callable[[Path], Any], type[Exception]]] = {
    "layer": (layer.load, layer.ConfigError),
    "proxy": (proxy_config.load, proxy_config.ConfigError),
    "runbooks": (runbooks_config.load, runbooks_config.ConfigError),
    "alerts": (alert_config.load, alert_config.ConfigError),
    "gateway topology": (haproxy.load, haproxy.TopologyError),
    "k8s site": (load_site, SiteError),
}


def _bomb() -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        aliases = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{aliases}]")
    return ("\n".join(lines) + "\n").encode()


BAD_FILES = {
    "absent": (None, r"top level: cannot read"),
    "oversize": (b"#" * (loader.MAX_FILE_BYTES + 1), r"top level: larger than \d+ bytes"),
    "alias bomb": (_bomb(), r"line 6: aliases expand to more than \d+ characters"),
    "alias of a long string": (
        b'url: &u "http://' + b"x" * 20_000 + b'"\nurls: [' + b", ".join([b"*u"] * 40) + b"]\n",
        r"line 2: aliases expand to more than \d+ characters",
    ),
    "alias inside its anchor": (b"a: &a [1, *a]\n", r"line 1: alias \*a is inside its own anchor"),
    "deep nesting": (b"a: " + b"[" * 60 + b"]" * 60, r"line 1: nested deeper than 48 levels"),
    "huge integer": (b"a:\n  b: 99999999999999999999\n", r"line 2: integer larger than"),
    "not UTF-8": (b"a: 1\nb: \xff\xfe\n", r"line 2: not UTF-8 text"),
    "bad YAML": (b"a: 1\nb: [\n", r"line 3: invalid YAML"),
}


@pytest.mark.parametrize("loader_name", sorted(LOADERS))
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_each_class_of_unreadable_file_is_one_line(
    tmp_path: Path, loader_name: str, case: str
) -> None:
    load, error = LOADERS[loader_name]
    content, reason = BAD_FILES[case]
    path = tmp_path / "config.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(error) as raised:
        load(path)
    text = str(raised.value)
    assert re.match(rf"^{re.escape(str(path))}: {reason}", text), text
    assert "\n" not in text


def test_an_alias_bomb_is_refused_while_composing_not_after() -> None:
    """Expanded, the bomb has 10**9 nodes; refusing it must not build or walk them."""
    with pytest.raises(layer.ConfigError, match="aliases expand"):
        layer.parse(_bomb().decode(), "bomb.yaml")
    benign = layer.parse("base: &b {x: 1}\none: *b\ntwo: *b\n", "ok.yaml")
    assert benign["two"] == {"x": 1}


def test_merge_keys_within_the_alias_bound_still_load() -> None:
    """Thousands of tenants sharing their defaults through a merge key stay well inside."""
    tenants = "".join(f"  t{i}: {{<<: *d, key: k{i}}}\n" for i in range(2000))
    text = "defaults: &d {budget: 1000, window: 1d, rate: 10, model: m}\ntenants:\n" + tenants
    document = layer.parse(text, "tenants.yaml")
    assert document["tenants"]["t1999"] == {
        "budget": 1000,
        "window": "1d",
        "rate": 10,
        "model": "m",
        "key": "k1999",
    }


def test_the_largest_allowed_integer_still_loads() -> None:
    assert layer.parse(f"a: {loader.MAX_INTEGER}", "f") == {"a": loader.MAX_INTEGER}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"upstream": {"url": 8}}, r"upstream\.url: expected http://"),  # wrong type
        ({"limits": {"max_body_bytes": "big"}}, r"limits\.max_body_bytes: expected an integer"),
        ({"upstream": {"colour": "red"}}, r"upstream\.colour: unknown field"),
        ({"limits": {"queue_timeout": "1.5m"}}, r"limits\.queue_timeout: expected a duration"),
        ({"limits": {"queue_timeout": "11y"}}, r"limits\.queue_timeout: '11y' is longer than"),
        ({"limits": {"queue_timeout": "30m1h"}}, r"limits\.queue_timeout: expected a duration"),
        ({"limits": {"queue_timeout": "0s"}}, r"limits\.queue_timeout: must be at least 1ms"),
    ],
)
def test_field_mistakes_name_file_field_and_reason(document: Any, message: str) -> None:
    with pytest.raises(layer.ConfigError, match=rf"^proxy\.yaml: {message}"):
        proxy_config.parse(document, "proxy.yaml")


@pytest.mark.parametrize(
    ("text", "milliseconds", "spelled"),
    [
        ("1h30m", 5_400_000, "1h30m"),
        ("90s", 90_000, "1m30s"),
        ("2d", 172_800_000, "2d"),
        ("1w", 604_800_000, "1w"),
        ("1y2w3d4h5m6s7ms", 33_019_506_007, "1y2w3d4h5m6s7ms"),
        ("0", 0, "0s"),
        ("250ms", 250, "250ms"),
    ],
)
def test_durations_parse_know_their_seconds_and_format_back(
    text: str, milliseconds: int, spelled: str
) -> None:
    duration = Duration.parse(text)
    assert duration.milliseconds == milliseconds
    assert duration.seconds == milliseconds / 1000
    assert str(duration) == spelled and Duration.parse(spelled) == duration


@pytest.mark.parametrize("text", ["1.5m", "", "5", "30m1h", "1h1h", "1 h", "-5s", "1mo", "s"])
def test_only_prometheus_durations_parse(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration such as"):
        Duration.parse(text)


def test_a_duration_flag_refuses_a_bad_value_with_its_reason() -> None:
    @click.command()
    @click.option("--window", type=DurationParam(Duration.parse("10s"), Duration.parse("7d")))
    def command(window: Duration) -> None:
        click.echo(f"{window.seconds:g}")

    assert CliRunner().invoke(command, ["--window", "1h30m"]).output == "5400\n"
    for value, reason in (("1.5m", "expected a duration"), ("5s", "5s is outside 10s..1w")):
        result = CliRunner().invoke(command, ["--window", value])
        assert result.exit_code == 2 and reason in result.output, result.output


def _package_sources() -> list[Path]:
    return [p for d in PACKAGE_DIRS for p in sorted((REPO / d).rglob("*.py"))]


def test_yaml_is_read_in_exactly_one_module() -> None:
    reading = re.compile(
        r"\byaml\.(?:safe_load|load|compose|safe_load_all|load_all)\b|\.get_single_data\("
    )
    readers = {p.relative_to(REPO).as_posix() for p in _package_sources() if reading.search(
        p.read_text(encoding="utf-8"))}  # fmt: skip
    assert readers == {"inferwatch/config/loader.py"}, readers


def test_durations_are_parsed_in_exactly_one_module() -> None:
    grammar = re.compile(r"re\.compile\(.*(?:ms\|s|s\|m|m\|h|h\|d|UNIT_MS)")
    parsers = {p.relative_to(REPO).as_posix() for p in _package_sources() if grammar.search(
        p.read_text(encoding="utf-8"))}  # fmt: skip
    assert parsers == {"inferwatch/config/duration.py"}, parsers


def _shipped_configs() -> list[Path]:
    found = [
        REPO / "inferwatch/mixin/config.yaml",
        REPO / "inferwatch/catalog.yaml",
        REPO / "exporters/gpu/xid.yaml",
        *sorted((REPO / "alerts").glob("*.yaml")),
        *sorted((REPO / "runbooks").glob("*.yaml")),
        *sorted((REPO / "inferwatch/demo/scenarios").glob("*.yaml")),
        *sorted((REPO / "deploy/kubernetes/sites").glob("*.yaml")),
        *sorted((REPO / "probes/goldens").glob("*.yaml")),
    ]
    return [p for p in found if p.exists()]


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_shipped_config_loads_through_the_layer(path: Path) -> None:
    assert layer.load(path) is not None


def _read(document: Any, read: Any) -> Any:
    """What ``read`` gives from a Fields over ``document``, or the one line it fails with."""
    try:
        return read(Fields("c.yaml", document))
    except layer.ConfigError as exc:
        return str(exc)


@pytest.mark.parametrize(
    ("document", "read", "expected"),
    [
        ({"n": 5}, lambda f: f.integer("n", 1, 1, 5), 5),
        (
            {"n": 6},
            lambda f: f.integer("n", 1, 1, 5),
            "c.yaml: n: expected an integer from 1 to 5, got 6",
        ),
        (
            {"x": float("inf")},
            lambda f: f.number("x", 0.0),
            "c.yaml: x: expected a number >= 0, got inf",
        ),
        ({}, lambda f: f.choice("mode", "hpa", ("none", "hpa")), "hpa"),
        (
            {"mode": "cpu"},
            lambda f: f.choice("mode", "hpa", ("none", "hpa")),
            "c.yaml: mode: expected one of none, hpa, got 'cpu'",
        ),
        (
            {"id": "a-1"},
            lambda f: f.matching("id", "", re.compile("[a-z0-9-]+"), "an id", 3),
            "a-1",
        ),
        (
            {"id": "a\n"},
            lambda f: f.matching("id", "", re.compile("[a-z0-9-]+"), "an id", 3),
            "c.yaml: id: expected an id, got 'a\\n'",
        ),
        (
            {"id": 12},
            lambda f: f.matching("id", "", re.compile("[a-z0-9-]+"), "an id", 3),
            "c.yaml: id: expected an id, got 12",
        ),
        (
            {"id": "abcd"},
            lambda f: f.matching("id", "", re.compile("[a-z0-9-]+"), "an id", 3),
            "c.yaml: id: expected an id of at most 3 characters, got 4",
        ),
        ({"xs": [1, 2]}, lambda f: f.each("xs", number_of), [1.0, 2.0]),
        ({}, lambda f: f.each("xs", number_of), []),
        (
            {"xs": [1, "two"]},
            lambda f: f.each("xs", number_of),
            "c.yaml: xs[1]: expected a number, got 'two'",
        ),
        (
            {"xs": [1, 2, 3]},
            lambda f: f.each("xs", number_of, max_items=2),
            "c.yaml: xs: expected at most 2 items, got 3",
        ),
        (
            {"rs": [{"a": 1}, {"a": 2}]},
            lambda f: [r.integer("a", 0) for r in f.records("rs")],
            [1, 2],
        ),
        (
            {"rs": [{"a": 1}, {"a": -1}]},
            lambda f: [r.integer("a", 0) for r in f.records("rs")],
            "c.yaml: rs[1].a: expected an integer >= 0, got -1",
        ),
        (
            {"rs": [{"a": 1}, 7]},
            lambda f: f.records("rs"),
            "c.yaml: rs[1]: expected a mapping, got 7",
        ),
        ({"a": 1}, lambda f: f.check_keys({"a", "b"}, required={"b"}), "c.yaml: b: is required"),
    ],
)
def test_each_field_read_gives_its_value_or_one_line(
    document: Any, read: Any, expected: Any
) -> None:
    assert _read(document, read) == expected
