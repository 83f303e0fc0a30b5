"""``inferwatch generate``: write the files derived from the metric catalogue."""

from __future__ import annotations

from pathlib import Path

import click

from inferwatch import catalog, docs


@click.group()
def generate() -> None:
    """Regenerate files derived from the metric catalogue."""


@generate.command()
@click.option(
    "--path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=Path("README.md"),
    show_envvar=True,
    help="The README whose generated metric table is rewritten.",
)
@click.option(
    "--check",
    is_flag=True,
    show_envvar=True,
    help="Fail instead of writing when the table is stale.",
)
def readme(path: Path, check: bool) -> None:
    """Rewrite the metric table in README.md."""
    if check:
        current = path.read_text(encoding="utf-8")
        try:
            fresh = docs.render_readme(current, catalog.load())
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        if fresh != current:
            raise click.ClickException(f"the metric table in {path} is stale")
        return
    try:
        changed = docs.update_readme(path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{path}: {'updated' if changed else 'already current'}")
