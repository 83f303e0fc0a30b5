"""Every float flag of every command refuses ``nan`` and the infinities as bad input.

click's ``FloatRange`` lets ``nan`` through any bound (each comparison with it is false), so
``--latency-tolerance nan`` used to switch a canary check off; a threshold, deadline or rate
given as ``nan`` or ``inf`` is never what a user meant."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest

from inferwatch.cli import main
from inferwatch.clikit import FiniteFloat

pytestmark = pytest.mark.unit


def _float_options(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, click.Parameter]]:
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None
            yield from _float_options(sub, (*path, name))
        return
    for param in command.params:
        if isinstance(param.type, click.types.FloatParamType):
            yield f"{' '.join(path)} {param.opts[0]}", param


FLOAT_OPTIONS = list(_float_options(main))


def test_the_commands_have_float_flags_to_check() -> None:
    names = {name for name, _ in FLOAT_OPTIONS}
    assert "canary --latency-tolerance" in names and "sidecar --header-timeout" in names


@pytest.mark.parametrize(("name", "param"), FLOAT_OPTIONS, ids=[n for n, _ in FLOAT_OPTIONS])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
def test_every_float_flag_refuses_a_non_finite_value(
    name: str, param: click.Parameter, value: str
) -> None:
    assert isinstance(param.type, FiniteFloat), f"{name} takes {param.type!r}, not FiniteFloat"
    with pytest.raises(click.BadParameter):
        param.type.convert(value, param, None)
