"""The CLI helpers every subcommand shares: HOST:PORT parsing and option groups."""

from __future__ import annotations

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferwatch.clikit import parse_listen

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("value", "address"),
    [
        (":9400", ("0.0.0.0", 9400)),
        ("0.0.0.0:9400", ("0.0.0.0", 9400)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("localhost:65535", ("localhost", 65535)),
        ("[::1]:9400", ("::1", 9400)),
        ("[::]:8080", ("::", 8080)),
        ("[fe80::1%eth0]:80", ("fe80::1%eth0", 80)),
    ],
)
def test_listen_addresses_every_component_accepts(value: str, address: tuple[str, int]) -> None:
    assert parse_listen(value) == address


@pytest.mark.parametrize(
    "value",
    [
        "9400",  # no colon
        "host:",  # no port
        "host:65536",  # out of range
        "host:-1",
        "host:+80",
        "host:٣",  # a digit, but not ASCII
        "::1:9400",  # IPv6 without brackets: which colon ends the host?
        "[::1:9400",
        "::1]:9400",
        "[127.0.0.1]:80",  # brackets are for IPv6
        "my host:80",
    ],
)
def test_wrong_listen_values_name_the_flag(value: str) -> None:
    with pytest.raises(click.BadParameter) as raised:
        parse_listen(value, "--metrics-listen")
    assert raised.value.param_hint == "--metrics-listen"


@given(st.text(max_size=40))
def test_any_text_is_an_address_or_a_clear_error(value: str) -> None:
    try:
        host, port = parse_listen(value)
    except click.BadParameter as error:
        assert error.message
        return
    assert 0 <= port <= 65535
    assert not any(c.isspace() for c in host)
    assert int(value.rpartition(":")[2]) == port
