"""The sidecar's source catalogue: every source module registers once, with its own flags."""

from __future__ import annotations

import importlib
import pkgutil

import click

from inferwatch.exporters import sources
from inferwatch.exporters.sidecar_cli import sidecar
from inferwatch.exporters.sources import CATALOGUE


def test_every_source_module_is_in_the_catalogue_once() -> None:
    modules = [m.name for m in pkgutil.iter_modules(sources.__path__)]
    registered = [
        importlib.import_module(f"{sources.__name__}.{name}").REGISTRATION for name in modules
    ]
    assert sorted(r.name for r in registered) == sorted(r.name for r in CATALOGUE)
    assert len({r.name for r in CATALOGUE}) == len(CATALOGUE)


def test_the_sidecar_command_carries_every_sources_flags() -> None:
    flags = {opt for p in sidecar.params if isinstance(p, click.Option) for opt in p.opts}

    @click.command()
    def probe() -> None: ...

    for registration in CATALOGUE:
        for option in registration.options:
            option(probe)
    contributed = {opt for p in probe.params for opt in p.opts}
    assert contributed <= flags
    assert {"--engine-url", "--gpu", "--probes", "--warmup-batch-sizes"} <= contributed
