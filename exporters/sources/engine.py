"""The engine source: the replica's engine behind one /metrics URL (``EngineCollector``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import click

from inferwatch.clikit import FiniteFloat, option_group
from inferwatch.exporters.engine import adapters as engines
from inferwatch.exporters.engine.checks import Limits
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.registry import Built, Registration, Setup
from inferwatch.serving import page_fetch
from inferwatch.serving.page_fetch import EngineScraper

ENGINE_CHOICES = click.Choice(["auto", *engines.ENGINES])


def metrics_url(url: str) -> str:
    """The engine's metrics URL: a bare origin gets ``/metrics`` appended."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint="--engine-url")
    return url if parts.path not in ("", "/") else url.rstrip("/") + "/metrics"


#: Options of every command that scrapes an engine.
engine_options = option_group(
    click.option(
        "--engine",
        type=ENGINE_CHOICES,
        default="auto",
        show_envvar=True,
        help="Engine type; auto detects it from each page.",
    ),
    click.option(
        "--engine-timeout",
        type=FiniteFloat(min=0.1),
        default=page_fetch.DEFAULT_TIMEOUT_S,
        show_envvar=True,
        help="Seconds allowed for one engine scrape (lowered to fit Prometheus' timeout).",
    ),
    click.option(
        "--max-page-bytes",
        type=click.IntRange(min=1024),
        default=page_fetch.DEFAULT_MAX_BYTES,
        show_envvar=True,
        help="Engine pages larger than this are refused (counted as they are inflated, "
        "whatever the Content-Encoding).",
    ),
    click.option(
        "--max-series-per-family",
        type=click.IntRange(min=1),
        default=Limits.series_per_family,
        show_envvar=True,
        help="Series an engine metric family may pass on; the rest are dropped and counted "
        "(a histogram's buckets count as one series).",
    ),
    click.option(
        "--max-label-length",
        type=click.IntRange(min=16),
        default=Limits.label_length,
        show_envvar=True,
        help="Engine series with a longer label value are dropped and counted.",
    ),
)


def open_engine(
    url: str, options: Mapping[str, Any], identity: Mapping[str, str]
) -> EngineCollector:
    """The engine collector for ``url`` as ``engine_options`` describe it."""
    return EngineCollector(
        EngineScraper(
            metrics_url(url),
            timeout_s=options["engine_timeout"],
            max_bytes=options["max_page_bytes"],
        ),
        identity,
        engine=None if options["engine"] == "auto" else options["engine"],
        limits=Limits(options["max_series_per_family"], options["max_label_length"]),
    )


def build(setup: Setup) -> Built | None:
    url = setup.options["engine_url"]
    return Built([open_engine(url, setup.options, setup.identity)]) if url is not None else None


REGISTRATION = Registration(
    "engine",
    options=[
        click.option(
            "--engine-url",
            default=None,
            show_envvar=True,
            help="The engine's base URL or its /metrics URL, e.g. http://127.0.0.1:8000. "
            "Omitted: GPU-only mode (a DaemonSet on GPU nodes): GPU series of every GPU on the "
            "node, no engine series, /readyz 200 while the sidecar serves; --gpu-scope must "
            "then be node (the default there), and --probes and an admin token need an engine.",
        ),
        engine_options,
    ],
    build=build,
)
