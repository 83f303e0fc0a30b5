"""The ``inferwatch`` console script.

Subcommands live next to the code they drive and are imported only when used, so that
``inferwatch scrape`` does not pay for the simulator's imports. Every option has an
environment twin, ``INFERWATCH_<SUBCOMMAND>_<OPTION>`` (shown in each ``--help``). Exit
statuses come from :class:`inferwatch.exitcodes.ExitCode` (``docs/cli.md``). A subcommand
whose optional extra is not installed fails (exit 3) before its module is imported.
"""

from __future__ import annotations

import importlib

import click

from inferwatch import __version__, build_commit, logs
from inferwatch.clikit import missing_extras, require_extra
from inferwatch.exitcodes import ExitCode

# name -> (module, attribute) of a click command
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sidecar": ("inferwatch.exporters.sidecar_cli", "sidecar"),
    "scrape": ("inferwatch.exporters.sidecar_cli", "scrape"),
    "node-agent": ("inferwatch.nodeagent.agent", "node_agent"),
    "generate": ("inferwatch.generate.cli", "generate"),
    "capacity": ("inferwatch.capacity.cli", "capacity"),
    "advise": ("inferwatch.advise.cli", "advise"),
    "advisor": ("inferwatch.advise.serve", "advisor"),
    "canary": ("inferwatch.canary.cli", "canary"),
    "sim": ("inferwatch.sim.cli", "sim"),
    "demo": ("inferwatch.demo", "demo"),
    "drill": ("inferwatch.drill", "drill"),
    "proxy": ("inferwatch.proxy.cli", "proxy"),
    "report": ("inferwatch.report.cli", "report"),
    "probe": ("inferwatch.probes.cli", "probe"),
    "gate": ("inferwatch.probes.cli", "gate"),
    "runbooks": ("inferwatch.runbooks.cli", "runbooks"),
    "snapshot": ("inferwatch.dashboards.snapshot", "snapshot"),
}


def _needs_extra(name: str) -> click.Command:
    """A stand-in for a subcommand whose extra is not installed (its module would not even
    import): listed in the help as such, and failing with one line, whatever its arguments."""

    @click.command(
        name=name,
        help=f"Needs inferwatch[{','.join(missing_extras(name))}], which is not installed.",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def stand_in() -> None:
        require_extra(name)

    return stand_in


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        if missing_extras(cmd_name):
            return _needs_extra(cmd_name)
        module_name, attribute = SUBCOMMANDS[cmd_name]
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> object:
        """Ctrl-C ends any command with INTERRUPTED (click would say "Aborted!" and exit 1)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None


@click.group(
    cls=LazyGroup,
    context_settings={
        "auto_envvar_prefix": "INFERWATCH",
        "show_default": True,
        "help_option_names": ["-h", "--help"],
    },
)
@click.version_option(
    __version__, prog_name="inferwatch", message=f"%(prog)s %(version)s (commit {build_commit()})"
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_envvar=True,
    help="Least severe level that is logged.",
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "text"]),
    default="auto",
    show_envvar=True,
    help="auto: JSON lines unless stderr is a terminal.",
)
def main(log_level: str, log_format: str) -> None:
    """Observability and SRE toolkit for LLM inference fleets."""
    logs.configure(log_level, None if log_format == "auto" else log_format == "json")
