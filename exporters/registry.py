"""How a source joins the sidecar: one ``Registration`` per source, listed in ``sources``.

As in node_exporter, a source brings its own flags and builds itself from their values; the
sidecar command adds every registration's options and serves whatever they build, so it
knows none of its sources by name. A registration whose flags leave it nothing to do builds
nothing (no engine URL, ``--gpu none``, no golden set); one that cannot run as asked raises
a ``click.UsageError`` or ``click.BadParameter`` with the one-line reason.

Each registration also gets a node_exporter-style switch, ``--collector.NAME`` /
``--no-collector.NAME`` (``switch``): a switched-off source builds nothing, whatever its
other flags say, so an operator can turn one off without unsetting them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from inferwatch.exporters.collector import Job

T = TypeVar("T")
#: a click option decorator
Option = Callable[[Any], Any]


@dataclass
class Built:
    """What one registration adds to the sidecar: its sources (each used for every
    interface of ``collector`` it implements) and any jobs that tie it to another source."""

    sources: list[object]
    background: list[Job] = field(default_factory=list)
    #: fields of the sidecar's "starting" log line (what the operator should see it chose)
    log: dict[str, str] = field(default_factory=dict)


@dataclass
class Setup:
    """What a registration builds from: the command's option values and what came before."""

    #: every option of the sidecar command, by parameter name
    options: Mapping[str, Any]
    #: the identity labels given by flags (empty where the engine may tell them)
    identity: Mapping[str, str]
    built: dict[str, Built] = field(default_factory=dict)

    def source(self, name: str, kind: type[T]) -> T | None:
        """The ``kind`` source an earlier registration ``name`` built, if it built one."""
        done = self.built.get(name)
        found = [s for s in done.sources if isinstance(s, kind)] if done else []
        return found[0] if found else None


@dataclass(frozen=True)
class Registration:
    #: the source's name (its ``collector`` label where it serves metrics)
    name: str
    #: click options the source contributes to ``inferwatch sidecar``, in help order
    options: Sequence[Option]
    #: builds the source from the options, or None when they leave it nothing to do
    build: Callable[[Setup], Built | None]
    #: whether the source is on without ``--collector.NAME``
    enabled_by_default: bool = True

    @property
    def switch_name(self) -> str:
        """The parameter name of the source's on/off switch."""
        return f"collector_{self.name}"

    def switch(self) -> Option:
        """``--collector.NAME/--no-collector.NAME`` (env twin INFERWATCH_<CMD>_COLLECTOR_NAME)."""
        return click.option(
            f"--collector.{self.name}/--no-collector.{self.name}",
            self.switch_name,
            default=self.enabled_by_default,
            show_envvar=True,
            help=f"Run the {self.name} source; switched off, it builds nothing whatever its "
            "other flags say.",
        )


def build_all(registrations: Sequence[Registration], setup: Setup) -> Built:
    """Every switched-on registration's sources and jobs, in catalogue order (later ones may
    use earlier ones' sources through ``Setup.source``)."""
    everything = Built([])
    disabled = [r.name for r in registrations if not setup.options[r.switch_name]]
    if disabled:
        everything.log["collectors_disabled"] = ",".join(disabled)
    for registration in registrations:
        if registration.name in disabled:
            continue
        built = registration.build(setup)
        if built is not None:
            setup.built[registration.name] = built
            everything.sources.extend(built.sources)
            everything.background.extend(built.background)
            everything.log.update(built.log)
    return everything
