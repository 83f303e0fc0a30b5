"""``inferwatch snapshot``: one board rendered to a PNG from Prometheus, without Grafana.

Each panel is drawn where the board puts it (gridPos), from ``query_range`` over the chosen
window, with its title, unit, legend and threshold lines, so the picture reads like the board.
It is what an engineer without Grafana access looks at, and what runbook actions attach.
Prometheus answers are bounded (bytes per answer, series drawn per panel).
"""

from __future__ import annotations

import io
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import httpx

from inferwatch.alerts import config as alert_config
from inferwatch.clikit import (
    BadInput,
    CannotRun,
    cannot_write,
    config_option,
    out_file_option,
    prometheus_option,
)
from inferwatch.config import Duration
from inferwatch.dashboards import queries, writer
from inferwatch.mixin import recording
from inferwatch.mixin.model import Recording
from inferwatch.serving import bounded_request, prometheus_api
from inferwatch.serving.bounded_request import Deadline, RequestFailed
from inferwatch.serving.prometheus_api import DEADLINE_S

#: largest Prometheus answer read per query
MAX_ANSWER_BYTES = 16 << 20
#: the longest window drawn, and the longest scrape interval taken
MAX_WINDOW, MAX_SCRAPE_INTERVAL = "90d", "1h"
#: series drawn per panel (the legend says how many more there were)
MAX_SERIES = 12
#: points per series asked for (the step follows from the window)
POINTS = 240
WIDTH_IN, GRID_UNIT_IN, DPI = 16.0, 0.34, 80
#: time-axis tick intervals tried, seconds
TICK_STEPS = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
              172800, 604800)  # fmt: skip
#: grid units under a time series for its time axis and legend
LEGEND_UNITS = 2.6
#: panel types drawn as lines over time with a legend: a state timeline as its 0/1 steps, a
#: heatmap as one line per bucket (``le``)
DRAWN_OVER_TIME = ("timeseries", "state-timeline", "heatmap")
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
#: Grafana unit ids -> the name printed after a value (``suffix:x`` units print ``x``)
UNIT_NAMES = {"reqps": "req/s", "watt": "W", "celsius": "°C", "hertz": "Hz"}
_IEC = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def _duration(option: str, value: str, longest: str) -> Duration:
    try:
        duration = Duration.parse(value)
    except ValueError as exc:
        raise BadInput(f"{option}: {exc}") from None
    if duration.milliseconds == 0:
        raise BadInput(f"{option}: must be longer than 0s, got {value!r}")
    if duration.milliseconds > Duration.parse(longest).milliseconds:
        raise BadInput(f"{option}: at most {longest}, got {value!r}")
    return duration


@dataclass
class Series:
    label: str
    times: list[datetime]
    values: list[float]


def format_value(value: float, unit: str) -> str:
    """A value as Grafana shows it for the units the boards use."""
    if math.isnan(value):
        return "NaN"
    if unit == "percentunit":
        return f"{value * 100:.3g}%" if abs(value) < 10 else f"{value * 100:,.0f}%"
    if unit == "bool_yes_no":
        return "yes" if value else "no"
    if unit == "s":
        if value and abs(value) < 1:
            return f"{value * 1000:.3g} ms"
        return f"{value:.3g} s"
    if unit == "bytes":
        for size, name in _IEC:
            if abs(value) >= size:
                return f"{value / size:.3g} {name}"
        return f"{value:.3g} B"
    if unit == "currencyUSD":
        return f"${value:.3g}"
    name = "" if unit == "short" else UNIT_NAMES.get(unit, unit.removeprefix("suffix:").strip())
    number, prefix = f"{value:.3g}", ""
    for scale, candidate in _SI:
        if abs(value) >= scale:
            number, prefix = f"{value / scale:.3g}", candidate
            break
    if not name:
        return number + prefix
    # Grafana writes SI units as "2.5 GHz" and custom suffixes as "1.2K tok/s"
    return f"{number}{prefix} {name}" if unit.startswith("suffix:") else f"{number} {prefix}{name}"


def legend(template: str, labels: Mapping[str, str]) -> str:
    """Grafana's legend format: ``{{label}}`` replaced; ``__auto`` (or empty) lists labels."""
    if template in ("", "__auto"):
        shown = {k: v for k, v in labels.items() if k != "__name__"}
        return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), template).strip()


class Prometheus:
    """The two queries a snapshot needs, with every failure as one line: unreachable or too
    slow is CANNOT_RUN, an answer that is not Prometheus's a BadInput (the URL is wrong).

    Prometheus is not trusted: each answer is read up to ``MAX_ANSWER_BYTES``, all queries of
    one snapshot share one deadline (a server that trickles bytes never outlasts it), and an
    answer of any other shape than the API's is refused before anything is drawn from it.
    """

    def __init__(self, url: str, http: httpx.Client, deadline_s: float = DEADLINE_S) -> None:
        self.url = url.rstrip("/")
        self.http = http
        self.deadline = Deadline(deadline_s)

    def get(self, path: str, params: Mapping[str, Any]) -> Any:
        try:
            status, body = bounded_request.fetch(
                self.http,
                "GET",
                f"{self.url}{path}",
                what=f"Prometheus at {self.url}",
                deadline=self.deadline,
                max_bytes=MAX_ANSWER_BYTES,
                params=params,
            )
        except RequestFailed as exc:
            failure = BadInput if exc.too_large else CannotRun
            raise failure(str(exc)) from None
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            raise BadInput(f"{self.url} answered {status} without JSON: is it "
                           "a Prometheus?") from None  # fmt: skip
        if not isinstance(document, dict) or document.get("status") != "success":
            error = document.get("error") if isinstance(document, dict) else None
            reason = _one_line(error) if isinstance(error, str) else "not a Prometheus API answer"
            raise BadInput(f"Prometheus refused {params.get('query', path)!r}: {reason}")
        data = document.get("data")
        if not isinstance(data, dict):
            raise BadInput(f"{self.url} answered without data: is it a Prometheus?")
        return data

    def recording_rules(self) -> set[str]:
        """The names of the recording rules Prometheus evaluates (``/api/v1/rules``)."""
        data = self.get("/api/v1/rules", {"type": "record"})
        try:
            return {str(rule["name"]) for group in data["groups"] for rule in group["rules"]
                    if rule.get("type", "recording") == "recording"}  # fmt: skip
        except (KeyError, TypeError, AttributeError):
            raise BadInput(f"{self.url} answered /api/v1/rules without rule groups: is it "
                           "a Prometheus?") from None  # fmt: skip

    def range(self, expr: str, start: float, end: float, step: float) -> list[Range]:
        data = self.get(
            "/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step}
        )
        result = data.get("result")
        if data.get("resultType") != "matrix" or not isinstance(result, list):
            raise BadInput(f"Prometheus answered {expr!r} with no range of series")
        return [_range(expr, series, start, end) for series in result]


@dataclass(frozen=True)
class Range:
    """One series of a range answer: its labels and its finite points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


def _range(expr: str, series: Any, start: float, end: float) -> Range:
    """A series as the API gives it, checked: labels are strings, points are (time, value)
    pairs of numbers, times inside the window asked for."""
    try:
        metric, values = series["metric"], series["values"]
        if not isinstance(metric, dict) or not isinstance(values, list):
            raise TypeError
        labels = {str(k): str(v) for k, v in metric.items()}
        points = [(float(t), float(v)) for t, v in values]
    except (KeyError, TypeError, ValueError):
        raise BadInput(f"Prometheus answered {expr!r} with a malformed series") from None
    if any(not start - 1 <= t <= end + 1 for t, _ in points):
        raise BadInput(f"Prometheus answered {expr!r} with points outside the window")
    return Range(labels, [(t, v) for t, v in points if math.isfinite(v)])


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


@dataclass(frozen=True)
class Window:
    """The time range drawn: the last ``seconds`` up to now, at about POINTS points."""

    start: float
    end: float
    step: float

    @classmethod
    def last(cls, seconds: float) -> Window:
        end = time.time()
        return cls(end - seconds, end, max(1.0, round(seconds / POINTS)))

    def grafana(self, values: Mapping[str, str], scrape_s: float) -> dict[str, str]:
        """The board's variables plus Grafana's own for this range."""
        rate = queries.rate_interval(self.step, scrape_s)
        return {**values, "__interval": queries.duration(self.step),
                "__range": queries.duration(self.end - self.start),
                "__rate_interval": queries.duration(rate)}  # fmt: skip

    @property
    def clock(self) -> str:
        span = self.end - self.start
        return "%H:%M:%S" if span <= 1800 else ("%H:%M" if span <= 86400 else "%m-%d %H:%M")


def fetch(
    prom: Prometheus, panel: Mapping[str, Any], values: Mapping[str, str], window: Window
) -> tuple[list[Series], int]:
    """The panel's series (at most MAX_SERIES) and how many more there were."""
    drawn: list[Series] = []
    total = 0
    for target in panel.get("targets", []):
        expr = queries.substitute(target["expr"], values)
        for series in prom.range(expr, window.start, window.end, window.step):
            points = series.points
            if not points:
                continue
            total += 1
            if len(drawn) < MAX_SERIES:
                drawn.append(Series(
                    legend(target.get("legendFormat", ""), series.labels),
                    [datetime.fromtimestamp(t, UTC) for t, _ in points], [v for _, v in points],
                ))  # fmt: skip
    return drawn, total - len(drawn)


def render(
    dashboard: Mapping[str, Any], prom: Prometheus, values: Mapping[str, str], window: Window,
    out: Path, subtitle: str,
) -> tuple[int, int]:  # fmt: skip
    """Draw the board into ``out``; returns (panels, panels with data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = dashboard["panels"]
    units = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in grid) + 2  # + the title band
    fig = plt.figure(figsize=(WIDTH_IN, units * GRID_UNIT_IN), dpi=DPI)
    fig.text(0.01, 1 - 0.6 / units, dashboard["title"], fontsize=15, weight="bold",
             va="center")  # fmt: skip
    fig.text(0.99, 1 - 0.6 / units, subtitle, fontsize=9, ha="right", va="center")
    with_data = 0
    for panel in grid:
        x, y, w, h = (panel["gridPos"][k] for k in ("x", "y", "w", "h"))
        left, bottom = x / 24, 1 - (y + h + 2) / units
        if panel.get("type") == "row":
            fig.text(left + 0.005, bottom + 0.5 / units, panel["title"], fontsize=11,
                     weight="bold", va="center", color="#333333")  # fmt: skip
            continue
        below = LEGEND_UNITS if panel.get("type") in DRAWN_OVER_TIME else 0.4
        ax = fig.add_axes((left + 0.035, bottom + below / units,
                           w / 24 - 0.045, (h - below - 0.9) / units))  # fmt: skip
        ax.set_title(panel["title"], fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        series, more = fetch(prom, panel, values, window)
        if series:
            with_data += 1
            _draw(ax, panel, series, more, window)
        else:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes,
                    color="#888888", fontsize=10)  # fmt: skip
            ax.set_xticks([])
            ax.set_yticks([])
    _save(fig, out)
    plt.close(fig)
    return len(queries.panels(dashboard)), with_data


def _save(fig: Any, out: Path) -> None:
    """The figure as a palette PNG: a board is a few flat colours, so 256 of them lose
    nothing visible and the file is a third of the size."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=DPI, format="png")
    buffer.seek(0)
    with Image.open(buffer) as image:
        try:
            image.convert("RGB").quantize(colors=256).save(out, format="PNG", optimize=True)
        except OSError as exc:
            raise cannot_write(exc) from None


def _draw(
    ax: Any, panel: Mapping[str, Any], series: Sequence[Series], more: int, window: Window
) -> None:
    """One panel with data: lines with thresholds and a legend, or last values as text."""
    from matplotlib.ticker import FuncFormatter

    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    if panel.get("type") in ("stat", "table"):
        _text_panel(ax, series, more, unit)
        return
    columns = max(1, min(3, panel["gridPos"]["w"] // 4))
    for s in series:
        ax.plot(s.times, s.values, linewidth=1.2,
                label=s.label[: panel["gridPos"]["w"] * 6 // columns])  # fmt: skip
    if unit == "bool_yes_no":
        ax.set_yticks([0, 1])
    _thresholds(ax, panel, series, unit)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_value(v, unit)))
    ax.set_xlim(datetime.fromtimestamp(window.start, UTC), datetime.fromtimestamp(window.end, UTC))
    ticks = time_ticks(window.start, window.end)
    ax.set_xticks(ticks, [tick.strftime(window.clock) for tick in ticks])
    ax.grid(True, linewidth=0.3, alpha=0.6)
    handles, labels = ax.get_legend_handles_labels()
    if more:
        labels[-1] += f"  (+{more} more series)"
    ax.legend(handles, labels, fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.1),
              ncols=columns, frameon=False, borderaxespad=0, handlelength=1.5)  # fmt: skip


def time_ticks(start: float, end: float, most: int = 6) -> list[datetime]:
    """Ticks at the first round interval that gives at most ``most`` of them in the window,
    in UTC: round there whatever the local zone's offset (India's +5:30 would put an hourly
    tick at :30), and the time Prometheus and Alertmanager show."""
    step = next((s for s in TICK_STEPS if (end - start) / s <= most), TICK_STEPS[-1])
    first = math.ceil(start / step) * step
    count = int((end - first) // step) + 1
    return [datetime.fromtimestamp(first + i * step, UTC) for i in range(count)]


def _thresholds(ax: Any, panel: Mapping[str, Any], series: Sequence[Series], unit: str) -> None:
    """Dashed threshold lines inside the data's range; the ones above it are named."""
    steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
    high = max(max(s.values) for s in series)
    low, top = ax.get_ylim()
    above = []
    for step in steps:
        if step.get("value") is None:
            continue
        value = float(step["value"])
        if value <= max(top, high * 1.1):
            ax.axhline(value, color=step["color"], linestyle="--", linewidth=1)
        else:
            above.append(f"{step['color']} at {format_value(value, unit)}")
    ax.set_ylim(min(low, 0), max(top, high * 1.08) if high > 0 else top)  # line off the frame
    if above:
        ax.text(0.99, 0.97, "thresholds above: " + ", ".join(above), ha="right", va="top",
                transform=ax.transAxes, fontsize=6, color="#aa3333")  # fmt: skip


def _text_panel(ax: Any, series: Sequence[Series], more: int, unit: str) -> None:
    """A stat or table panel: one line per series with its last value."""
    ax.set_xticks([])
    ax.set_yticks([])
    lines = [f"{s.label}: {format_value(s.values[-1], unit)}" for s in series]
    if more:
        lines.append(f"... and {more} more")
    ax.text(0.03, 0.95, "\n".join(lines), ha="left", va="top", transform=ax.transAxes,
            fontsize=8, family="monospace")  # fmt: skip


def rules_mismatch(dashboard: Mapping[str, Any], config: alert_config.Config,
                   evaluated: set[str]) -> str | None:  # fmt: skip
    """One line when the board reads recording rules Prometheus does not evaluate (its rules
    come from another alert config, or none are loaded): those panels would draw nothing."""
    ours = {rule.record for group in recording.groups(config) for rule in group.rules
            if isinstance(rule, Recording)}  # fmt: skip
    names = {match for target in queries.targets(dashboard)
             for match in re.findall(r"[A-Za-z_:][\w:]*", target.expr)}  # fmt: skip
    read = sorted(ours & names)
    missing = [name for name in read if name not in evaluated]
    if not missing:
        return None
    foreign = sorted(name for name in evaluated - ours if "inferwatch_" in name)
    why = (
        f"it evaluates other inferwatch rules (e.g. {foreign[0]}): its rules were generated "
        "from another alert config than this snapshot's --config"
        if foreign
        else "it loads no inferwatch recording rules (inferwatch generate alerts)"
    )
    return (f"Warning: Prometheus lacks {len(missing)} of the {len(read)} recording rules "
            f"board {dashboard['uid']} reads (e.g. {missing[0]}); {why}. Panels reading them "
            "draw nothing.")  # fmt: skip


def variable_values(dashboard: Mapping[str, Any], given: Sequence[str]) -> dict[str, str]:
    """Every board variable as a regex matcher value: ``.*`` (All) unless given."""
    names = [v["name"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    values = {name: ".*" for name in names}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not value:
            raise BadInput(f"--var {item!r}: expected NAME=VALUE")
        if name not in values:
            raise BadInput(f"--var {name}: the board has no such variable ({', '.join(names)})")
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise BadInput(f"--var {name}: control characters are not allowed in a value")
        # Every board uses a variable inside a double-quoted matcher (=~"$name"): after the
        # regex escaping, a quote is escaped too, so a value is one label value and never
        # ends the string to add a matcher or an expression of its own.
        values[name] = queries.regex_value([value]).replace('"', '\\"')
    return values


@click.command()
@click.option(
    "--dashboard",
    required=True,
    show_envvar=True,
    help="Board to render: fleet, latency, replica, gpu, cost, quality, versions, gateway.",
)
@prometheus_option()
@click.option(
    "--from",
    "since",
    default="15m",
    envvar="INFERWATCH_SNAPSHOT_FROM",
    show_envvar=True,
    help="How far back from now to draw (a Prometheus duration).",
)
@out_file_option("PNG to write [default: <dashboard>.png].")
@click.option(
    "--var",
    multiple=True,
    show_envvar=True,
    help="Set a board variable, NAME=VALUE (repeatable); unset ones are All.",
)
@click.option(
    "--scrape-interval",
    default="15s",
    show_envvar=True,
    help="Prometheus's scrape interval, for $__rate_interval as Grafana computes it.",
)
@config_option("snapshot", "Alert config the boards are built from (thresholds, selectors).")
@prometheus_api.timeout_option(
    "Seconds all queries to Prometheus may take together (exit 3 past it)."
)
def snapshot(dashboard: str, prometheus: str, since: str, out: Path | None, var: tuple[str, ...],
             scrape_interval: str, config_path: Path | None, timeout: float) -> None:  # fmt: skip
    """Render one dashboard's panels from Prometheus into a PNG, laid out as the board is."""
    name, url = dashboard, prometheus
    back = _duration("--from", since, MAX_WINDOW)
    interval = _duration("--scrape-interval", scrape_interval, MAX_SCRAPE_INTERVAL)
    try:
        url = prometheus_api.checked_url(url)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    try:
        config = alert_config.load(config_path)
    except alert_config.ConfigError as exc:
        raise BadInput(str(exc)) from None
    boards = writer.dashboards(config)
    if name not in boards:
        raise BadInput(f"unknown dashboard {name!r}; known: {', '.join(boards)}")
    board = boards[name]
    values = variable_values(board, var)
    target = out if out is not None else Path(f"{name}.png")
    shown = ", ".join(var) or "all variables at All"
    # identity: httpx inflates a compressed network chunk in one call, past any cap
    with httpx.Client(headers={"Accept-Encoding": "identity"}) as http:
        prom = Prometheus(url, http, deadline_s=timeout)
        prom.get("/api/v1/status/buildinfo", {})  # reachable and a Prometheus, or one line
        mismatch = rules_mismatch(board, config, prom.recording_rules())
        if mismatch is not None:
            click.echo(mismatch, err=True)
        window = Window.last(back.seconds)
        until = datetime.fromtimestamp(window.end, UTC)
        subtitle = f"last {since} to {until:%Y-%m-%d %H:%M} UTC · {shown}"
        grafana = window.grafana(values, interval.seconds)
        total, with_data = render(board, prom, grafana, window, target, subtitle)
    if with_data == 0:
        target.unlink(missing_ok=True)
        raise BadInput(f"no data for any panel of {name} in the last {since} at {url}")
    click.echo(f"{target}: {name}, {with_data} of {total} panels with data")
