"""``inferwatch report``: totals from what inferwatch recorded (``usage``: chargeback)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

import click

from inferwatch.alerts import config as alert_config
from inferwatch.canary.prometheus import Prometheus, PrometheusError
from inferwatch.clikit import (
    BadInput,
    CannotRun,
    Failed,
    FiniteFloat,
    missing_extra,
    out_file_option,
    prometheus_option,
)
from inferwatch.config import ConfigError, Duration, DurationParam, Fields
from inferwatch.proxy import sharedconfig
from inferwatch.report import parquet
from inferwatch.report import usage as ledger
from inferwatch.report.idle import spread
from inferwatch.report.reconcile import reconcile
from inferwatch.serving import prometheus_api

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
#: where the cost is among a row's fields (the token counts and requests before it)
_COST = ledger.FIELDS.index("cost")
#: longest wait for one reply of Redis (a page of the usage stream)
REDIS_TIMEOUT_S = 10.0


def _drift_tokens() -> float:
    """The proxy's own drift tolerance, the reconciliation's base allowance."""
    return alert_config.load().alert("InferwatchReconciliationDrift").number("tokens")


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
    show_envvar=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The proxy's usage_log directory (every proxy's files, if they share it).  "
    "[--log-dir, --redis, or both]",
)
@click.option(
    "--redis",
    show_envvar=True,
    help="The proxies' shared_state Redis, whose usage stream (usage_log.stream) is read: "
    "redis://host:port/db, rediss://..., unix:///path, redis+sentinel://... or "
    "redis+cluster://..., as in the proxy config (no password in it).",
)
@click.option(
    "--redis-key-prefix",
    default="inferwatch",
    show_envvar=True,
    help="The proxies' shared_state.key_prefix: the stream read is <prefix>:usage:{log}.",
)
@click.option(
    "--redis-password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    show_envvar=True,
    help="A file holding Redis's password.",
)
@click.option(
    "--lateness",
    type=DurationParam(Duration(0), Duration.of_seconds(7 * 86400)),
    default="1h",
    show_default=True,
    show_envvar=True,
    help="How long after --to a proxy may have appended a line of the window to the "
    "stream (Redis down when it settled): lines appended later are not read.",
)
@click.option(
    "--max-entries",
    type=click.IntRange(1, 10**9),
    default=10_000_000,
    show_default=True,
    show_envvar=True,
    help="Most stream entries read around the window; past it the report stops (exit 2).",
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
    type=click.Choice(["csv", "json", "parquet"]),
    default="csv",
    show_envvar=True,
    show_default=True,
    help="csv (a totals line starting with # at the end), json, or parquet (the totals in "
    "the file's metadata; needs --out and inferwatch[parquet]).",
)
@out_file_option(
    "Write the report to this file instead of stdout (replaced whole, never half written).  "
    "[required for parquet]"
)
@prometheus_option(
    required=False,
    why="reconcile the report's tokens with the engines' own counters over the window "
    "(a footer; exit 1 when they differ by more than --tolerance)",
)
@click.option(
    "--scrape-interval",
    type=DurationParam(Duration.of_seconds(1), Duration.of_seconds(3600)),
    default="15s",
    show_default=True,
    show_envvar=True,
    help="How often Prometheus scrapes the engines: what increase() may miscount at each "
    "edge of the window is the engines' token rate times this.",
)
@click.option(
    "--tolerance",
    type=FiniteFloat(min=0),
    show_envvar=True,
    help="Tokens the reconciliation may differ by.  [default: the tokens of the alert "
    "config's InferwatchReconciliationDrift plus the edges' allowance]",
)
@click.option(
    "--gpu-hour-price",
    type=FiniteFloat(min=0, min_open=True),
    show_envvar=True,
    help="What one GPU-hour costs: adds each row's share of its model's idle GPU cost (the "
    "GPUs' unused hours, from Prometheus, spread by busy time). Needs --prometheus.",
)
@prometheus_api.timeout_option("Seconds all queries to Prometheus may take together (exit 3).")
def usage(
    log_dir: Path | None,
    redis: str | None,
    redis_key_prefix: str,
    redis_password_file: Path | None,
    lateness: Duration,
    max_entries: int,
    start: str,
    to: str,
    by: str,
    fmt: str,
    out: Path | None,
    prometheus: str | None,
    scrape_interval: Duration,
    tolerance: float | None,
    gpu_hour_price: float | None,
    timeout: float,
) -> None:
    """Chargeback per tenant x model x model version x day or hour, from the usage log.

    The log is the proxies' files (--log-dir), their Redis stream (--redis), or both added
    together. Cost uses the prices logged with each request. Skipped lines are named on
    stderr; exit 3 when Redis cannot be read. With
    --prometheus, a footer compares the tokens with the engines' counters over the window:
    exit 1 when they do not reconcile, 3 when Prometheus cannot be read. With
    --gpu-hour-price, each row also bears its share of its model's idle GPU cost.
    """
    begin, finish = _instant(start, "--from"), _instant(to, "--to")
    if finish <= begin:
        raise BadInput("--to must be after --from")
    if fmt == "parquet" and out is None:
        raise BadInput("--format parquet needs --out FILE (Parquet is binary)")
    if gpu_hour_price is not None and prometheus is None:
        raise BadInput("--gpu-hour-price needs --prometheus (the GPUs' utilization)")
    if log_dir is None and redis is None:
        raise BadInput("give --log-dir, --redis, or both: where the usage log is")
    shared = _shared_state(redis, redis_key_prefix, redis_password_file)
    client = None
    if prometheus is not None:
        try:
            client = Prometheus(prometheus, deadline_s=timeout)
        except PrometheusError as exc:
            raise BadInput(f"--prometheus: {exc}") from None
    totals = ledger.Totals(begin, finish, by)
    if log_dir is not None:
        ledger.report(str(log_dir), totals)
    if shared is not None:
        _read_stream(shared, totals, lateness.seconds, max_entries)
    for where in totals.skipped:
        click.echo(f"skipped {where}", err=True)
    if totals.skipped_lines > len(totals.skipped):
        click.echo(f"skipped {totals.skipped_lines - len(totals.skipped)} more lines", err=True)
    keyed = sorted(totals.rows.items())
    sums = [sum(v[index] for _, v in keyed) for index in range(_COST + 1)]
    footer: dict[str, int | float] = {
        **dict(zip(_COLUMNS[4:8], (int(n) for n in sums[:_COST]), strict=True)),
        "cost": round(sums[_COST], 9),
        "skipped_lines": totals.skipped_lines,
    }
    checked, idle = None, None
    if client is not None:
        logged = int(footer["prompt_tokens"] + footer["completion_tokens"])
        try:
            with client:
                checked = reconcile(client, begin, finish, logged, drift_tokens=_drift_tokens(),
                                    scrape_interval_s=scrape_interval.seconds,
                                    tolerance=tolerance)  # fmt: skip
                if gpu_hour_price is not None:
                    idle = spread(client, totals, begin, finish, by, price=gpu_hour_price,
                                  step_s=max(1, round(scrape_interval.seconds)))  # fmt: skip
        except PrometheusError as exc:
            raise CannotRun(str(exc)) from None
    columns = [*_COLUMNS, "idle_gpu_cost"] if idle is not None else list(_COLUMNS)
    rows = []
    for key, v in keyed:
        row = dict(zip(_COLUMNS, [*key, *(int(n) for n in v[:_COST]), round(v[_COST], 9)],
                       strict=True))  # fmt: skip
        if idle is not None:
            row["idle_gpu_cost"] = round(idle.by_row.get(key, 0.0), 9)
        rows.append(row)
    if idle is not None:
        footer["idle_gpu_cost"] = round(sum(idle.by_row.values()), 9)
        footer["idle_gpu_cost_unbilled"] = round(idle.unbilled, 9)
    document: dict[str, object] = {"totals": footer, "skipped": totals.skipped}
    if checked is not None:
        document["reconciliation"] = checked.fields()
    try:
        if fmt == "parquet":
            assert out is not None
            _whole(out, lambda path: parquet.write(path, columns, rows, document))
        else:
            text = _json(rows, document) if fmt == "json" else _csv(columns, rows, document)
            if out is None:
                click.echo(text, nl=False)
            else:
                _whole(out, lambda path: path.write_text(text, encoding="utf-8"))
    except OSError as exc:
        raise CannotRun(f"cannot write {out}: {exc.strerror or exc}") from None
    if checked is not None and not checked.ok:
        raise Failed(
            f"the report does not reconcile with the engines' counters: {_pairs(checked.fields())}"
        )


_STREAM_ONLY = ("redis_key_prefix", "redis_password_file", "lateness", "max_entries")


def _shared_state(
    url: str | None, prefix: str, password_file: Path | None
) -> sharedconfig.SharedState | None:
    """``--redis`` and its options, checked as the proxy checks its ``shared_state``."""
    if url is None:
        context = click.get_current_context()
        given = [
            name
            for name in _STREAM_ONLY
            if context.get_parameter_source(name) != click.core.ParameterSource.DEFAULT
        ]
        if given:
            raise BadInput(f"--{given[0].replace('_', '-')} needs --redis")
        return None
    from inferwatch.proxy import sharedstate

    if not sharedstate.AVAILABLE:
        raise missing_extra("report usage --redis", "redis")
    if "@" in url:  # the proxy's own rule, worded for the flags
        raise BadInput("--redis: no password in the URL: use --redis-password-file")
    raw: dict[str, str] = {"url": url, "key_prefix": prefix}
    if password_file is not None:
        raw["password_file"] = str(password_file)
    try:
        shared = sharedconfig.parse(Fields("--redis", raw))
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    return dataclasses.replace(shared, timeout_s=REDIS_TIMEOUT_S)


def _read_stream(
    shared: sharedconfig.SharedState, totals: ledger.Totals, lateness_s: float, most: int
) -> None:
    from redis.exceptions import RedisError

    from inferwatch.report import stream

    try:
        stream.report(shared, totals, lateness_s, most)
    except stream.TooManyEntries as exc:
        raise BadInput(str(exc)) from None
    except (RedisError, OSError, TimeoutError) as exc:
        raise CannotRun(
            f"cannot read the usage stream from {shared.url}: {exc or type(exc).__name__}"
        ) from None


def _json(rows: list[dict[str, object]], document: dict[str, object]) -> str:
    return json.dumps({"rows": rows, **document}) + "\n"


def _csv(columns: list[str], rows: list[dict[str, object]], document: dict[str, object]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    footer = document["totals"]
    assert isinstance(footer, dict)
    text.write("# totals " + _pairs(footer) + "\n")
    checked = document.get("reconciliation")
    if isinstance(checked, dict):
        text.write("# reconciliation " + _pairs(checked) + "\n")
    return text.getvalue()


def _whole(out: Path, write: Callable[[Path], object]) -> None:
    """``write`` a file beside ``out``, then move it into place: a reader never sees half."""
    handle, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(handle)
    partial = Path(name)
    try:
        write(partial)
        partial.replace(out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _pairs(fields: Mapping[str, object]) -> str:
    """``key=value ...``, a flag as yes or no (the reconciliation's footer and error)."""
    return " ".join(
        f"{k}={('yes' if v else 'no') if isinstance(v, bool) else v}" for k, v in fields.items()
    )
