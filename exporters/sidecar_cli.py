"""``inferwatch sidecar`` and ``inferwatch scrape``.

The sidecar's own options are the replica's identity, where it listens and its admin token;
every source adds its own (see ``exporters.sources``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import click
from prometheus_client.core import Metric

from inferwatch.clikit import (
    CannotRun,
    bind,
    downward_api_option,
    listen_option,
    option_group,
    parse_listen,
    token_file_option,
    token_from,
)
from inferwatch.exporters.collector import ReplicaSource
from inferwatch.exporters.registry import Setup, build_all
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.exporters.sources import CATALOGUE
from inferwatch.exporters.sources.engine import engine_options, open_engine
from inferwatch.logs import log_event
from inferwatch.serving import uvicorn_server
from inferwatch.serving.histogram import histogram_quantile
from inferwatch.serving.page_fetch import ScrapeFailure

logger = logging.getLogger("inferwatch.sidecar")


@click.command()
@listen_option(
    ":9400",
    "Every interface by default, unlike the runbook receiver (127.0.0.1): Prometheus scrapes "
    "a sidecar and the gateway checks its /readyz from other pods and nodes. Its admin "
    "endpoints need a token; give 127.0.0.1:9400 where only local scrapers call it.",
)
@click.option("--model", default="", show_envvar=True, help="Model label when the engine has none.")
@click.option(
    "--model-version",
    default="",
    show_envvar=True,
    help="Version label of the served weights (a rollout name, a checkpoint tag).",
)
@click.option(
    "--engine-version",
    default="",
    show_envvar=True,
    help="Engine version; read from the engine's version endpoint when empty.",
)
@click.option(
    "--prompt-version",
    default="",
    show_envvar=True,
    help="Version label of the system prompt or template the replica serves with.",
)
@downward_api_option("--pod", "POD_NAME", "Pod label of every series.", say_where=True)
@downward_api_option("--namespace", "POD_NAMESPACE", "Namespace label of every series.")
@downward_api_option("--node", "NODE_NAME", "Node label of every series.")
@click.option(
    "--pod-labels",
    type=click.Choice(["auto", "emit", "omit"]),
    default="auto",
    show_envvar=True,
    help="Whether series carry pod, namespace and node from the flags above. auto: omit "
    "them in Kubernetes, where the PodMonitor's target labels supply them (emitting them "
    "too would turn them into exported_pod...), emit them elsewhere; emit for scrape "
    "configs with honorLabels: true.",
)
@token_file_option(
    "--admin-token-file",
    "File holding the bearer token of POST/DELETE /admin/isolation (the runbook "
    "receiver's replica isolation). Without it (or INFERWATCH_SIDECAR_ADMIN_TOKEN) the admin "
    "endpoint answers 403.",
)
@uvicorn_server.limit_options
@option_group(*(option for source in CATALOGUE for option in (source.switch(), *source.options)))
def sidecar(
    listen: str,
    model: str,
    model_version: str,
    engine_version: str,
    prompt_version: str,
    pod: str,
    namespace: str,
    node: str,
    pod_labels: str,
    admin_token_file: Path | None,
    **options: Any,
) -> None:
    """Serve one canonical /metrics, /healthz and /readyz for one engine replica.

    Each scrape of /metrics scrapes the engine, maps its metrics onto inferwatch's schema and
    adds GPU telemetry. When the engine does not answer, the sidecar keeps serving: /metrics
    reports inferwatch_engine_up 0 with the failure reason counted, and /readyz answers 503.
    Without --engine-url it serves the node's GPU telemetry only.
    """
    host, port = parse_listen(listen)
    limits = uvicorn_server.limits_from(options)
    admin_token = token_from(
        os.environ.get("INFERWATCH_SIDECAR_ADMIN_TOKEN"),
        admin_token_file,
        "--admin-token-file",
        what="admin token",
    )
    emit_pod = emits_pod_labels(pod_labels, os.environ)
    identity = {
        "model": model,
        "model_version": model_version,
        "engine_version": engine_version,
        "prompt_version": prompt_version,
        **({"pod": pod, "namespace": namespace, "node": node} if emit_pod else {}),
    }
    setup = Setup({**options, "pod": pod, "namespace": namespace, "node": node}, identity)
    built = build_all(CATALOGUE, setup)
    if not built.sources:
        raise click.UsageError("every source is switched off or has nothing to do")
    replica = any(isinstance(source, ReplicaSource) for source in built.sources)
    if admin_token is not None and not replica:
        raise click.UsageError(
            "an admin token needs --engine-url: a GPU-only sidecar serves no traffic, so it "
            "has no replica to isolate"
        )
    app = Sidecar(built.sources, background=built.background, admin_token=admin_token).app()
    sock = bind((host, port))
    log_event(
        logger,
        logging.INFO,
        "sidecar starting"
        if replica
        else "sidecar starting in GPU-only mode: no --engine-url, "
        "serving GPU telemetry of every GPU on the node, no engine series, /readyz not gated",
        listen="{}:{}".format(*sock.getsockname()[:2]),
        **built.log,
        pod_labels="emitted" if emit_pod else "left to service discovery",
    )
    uvicorn_server.serve(app, sock, limits)


def emits_pod_labels(choice: str, environ: Mapping[str, str]) -> bool:
    """Whether series carry pod, namespace and node (``--pod-labels``).

    In Kubernetes a PodMonitor or ServiceMonitor already gives every series the target's
    namespace and pod (and node, by relabeling); labels of the same name on the page would
    be renamed exported_pod and so on, and break joins with every other pod metric.
    """
    return choice == "emit" or (choice == "auto" and not environ.get("KUBERNETES_SERVICE_HOST"))


@click.command()
@click.argument("url")
@engine_options
def scrape(url: str, **options: Any) -> None:
    """Print the canonical view of one scrape of the engine at URL, as a table."""
    collector = open_engine(url, options, {})
    engine_log = logging.getLogger("inferwatch.engine")

    async def once() -> Sequence[Metric]:
        try:
            families = await collector.collect()  # within the engine timeout
            # for the model line below; best effort, and within the timeout too, so that an
            # engine trickling its version endpoint holds the command twice the timeout at most
            with suppress(TimeoutError):
                async with asyncio.timeout(collector.timeout_s):
                    await collector.identify()
            return families
        finally:
            await collector.aclose()

    level = engine_log.level
    engine_log.setLevel(logging.ERROR)  # the error below says it (only for this command)
    try:
        families = asyncio.run(once())
    except ScrapeFailure as failure:
        raise CannotRun(f"scrape of {collector.scraper.url} failed: {failure}") from None
    finally:
        engine_log.setLevel(level)
    click.echo(f"engine: {collector.engine}   model: {collector.identity['model'] or '-'}")
    click.echo(render_table(families, hide=set(collector.identity)))


def render_table(families: Sequence[Metric], hide: set[str]) -> str:
    """One row per series; histograms show count, mean and an estimated p50/p99."""
    rows: list[tuple[str, str, str]] = []
    for family in families:
        if family.type == "histogram":
            rows.extend(_histogram_rows(family, hide))
            continue
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sample.labels.items() if k not in hide)
            rows.append((sample.name, labels, _fmt(sample.value)))
    widths = [
        max([len(h), *(len(r[i]) for r in rows)])
        for i, h in enumerate(("metric", "labels", "value"))
    ]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(("metric", "labels", "value"), widths, strict=True))
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _histogram_rows(family: Metric, hide: set[str]) -> list[tuple[str, str, str]]:
    buckets_by_series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    sums: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in family.samples:
        key = tuple((k, v) for k, v in sample.labels.items() if k not in hide and k != "le")
        if sample.name.endswith("_bucket"):
            bucket = (float(sample.labels["le"]), sample.value)
            buckets_by_series.setdefault(key, []).append(bucket)
        elif sample.name.endswith("_sum"):
            sums[key] = sample.value
    rows = []
    for key, unsorted in buckets_by_series.items():
        buckets = sorted(unsorted)
        count = buckets[-1][1]
        mean = sums.get(key, math.nan) / count if count else math.nan
        p50, p99 = (_fmt(histogram_quantile(buckets, q)) for q in (0.5, 0.99))
        summary = f"count={_fmt(count)} mean={_fmt(mean)} p50≈{p50} p99≈{p99}"
        rows.append((family.name, ",".join(f"{k}={v}" for k, v in key), summary))
    return rows


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"
