"""``inferwatch report``: totals from what inferwatch recorded (``usage``: chargeback)."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from pathlib import Path

import click

from inferwatch.clikit import BadInput
from inferwatch.report import usage as ledger

_COLUMNS = (
    "period",
    "tenant",
    "model",
    "model_version",
    "requests",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "cost",
)


def _instant(value: str, flag: str) -> float:
    """An ISO-8601 time with its offset (``Z`` too): a report never guesses a time zone."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadInput(f"{flag} {value!r} is not an ISO-8601 time") from None
    if moment.tzinfo is None:
        raise BadInput(f"{flag} {value!r} has no UTC offset (add Z or +00:00)")
    return moment.timestamp()


@click.group()
def report() -> None:
    """Reports totalled from inferwatch's own records."""


@report.command()
@click.option(
    "--log-dir",
    required=True,
    show_envvar=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The proxy's usage_log directory (every proxy's files, if they share it).",
)
@click.option(
    "--from",
    "start",
    envvar="INFERWATCH_REPORT_USAGE_FROM",
    required=True,
    show_envvar=True,
    help="Start of the window, ISO-8601 with its UTC offset (2026-11-01T00:00:00Z).",
)
@click.option(
    "--to",
    "to",
    required=True,
    show_envvar=True,
    help="End of the window, exclusive, ISO-8601 with its UTC offset.",
)
@click.option(
    "--by",
    type=click.Choice(["day", "hour"]),
    default="day",
    show_default=True,
    show_envvar=True,
    help="The period each row totals (UTC days or hours).",
)
@click.option(
    "--format",
    "fmt",
    envvar="INFERWATCH_REPORT_USAGE_FORMAT",
    type=click.Choice(["csv", "json"]),
    default="csv",
    show_envvar=True,
    show_default=True,
    help="csv (a totals line starting with # at the end) or json.",
)
def usage(log_dir: Path, start: str, to: str, by: str, fmt: str) -> None:
    """Chargeback per tenant x model x model version x day or hour, from the usage log.

    Cost uses the prices logged with each request. Skipped lines are named on stderr.
    """
    begin, finish = _instant(start, "--from"), _instant(to, "--to")
    if finish <= begin:
        raise BadInput("--to must be after --from")
    totals = ledger.report(str(log_dir), begin, finish, by)
    keyed = sorted(totals.rows.items())
    rows = [
        dict(zip(_COLUMNS, [*key, *(int(n) for n in v[:4]), round(v[4], 9)], strict=True))
        for key, v in keyed
    ]
    for where in totals.skipped:
        click.echo(f"skipped {where}", err=True)
    if totals.skipped_lines > len(totals.skipped):
        click.echo(f"skipped {totals.skipped_lines - len(totals.skipped)} more lines", err=True)
    sums = [sum(v[index] for _, v in keyed) for index in range(5)]
    footer = {
        **dict(zip(_COLUMNS[4:8], (int(n) for n in sums[:4]), strict=True)),
        "cost": round(sums[4], 9),
        "skipped_lines": totals.skipped_lines,
    }
    if fmt == "json":
        click.echo(json.dumps({"rows": rows, "totals": footer, "skipped": totals.skipped}))
        return
    out = io.StringIO()
    writer = csv.DictWriter(out, _COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    click.echo(out.getvalue(), nl=False)
    click.echo("# totals " + " ".join(f"{k}={v}" for k, v in footer.items()))
