"""``inferwatch sidecar`` and ``inferwatch scrape``."""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import click
import uvicorn
from prometheus_client.core import Metric

from inferwatch.auth import TokenError, load_token
from inferwatch.clikit import option_group, parse_listen
from inferwatch.exporters import engines, gpu, page_fetch
from inferwatch.exporters.collector import MetricSource, ReadinessSource
from inferwatch.exporters.engine_checks import Limits
from inferwatch.exporters.engine_collector import EngineCollector
from inferwatch.exporters.gpu import GpuTelemetry, scope
from inferwatch.exporters.gpu.scope import GpuScope
from inferwatch.exporters.histogram import histogram_quantile
from inferwatch.exporters.page_fetch import EngineScraper, ScrapeFailure
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.exporters.startup import StartupTracker
from inferwatch.exporters.warmup import Warmup, WarmupPlan
from inferwatch.logs import log_event
from inferwatch.probes import golden
from inferwatch.probes.client import Endpoint
from inferwatch.probes.runner import ProbeRunner, Schedule, Target

logger = logging.getLogger("inferwatch.sidecar")

ENGINE_CHOICES = click.Choice(["auto", *engines.ENGINES])


def metrics_url(url: str) -> str:
    """The engine's metrics URL: a bare origin gets ``/metrics`` appended."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint="--engine-url")
    return url if parts.path not in ("", "/") else url.rstrip("/") + "/metrics"


def int_list(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    """``1,8,32`` -> (1, 8, 32); every item a positive integer."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not all(item.isdigit() and int(item) > 0 for item in items):
        raise click.BadParameter(f"{value!r} is not a comma-separated list of positive integers")
    return tuple(int(item) for item in items)


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
        type=click.FloatRange(min=0.1),
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


@click.command()
@click.option(
    "--engine-url",
    default=None,
    show_envvar=True,
    help="The engine's base URL or its /metrics URL, e.g. http://127.0.0.1:8000. Omitted: "
    "GPU-only mode (a DaemonSet on GPU nodes): GPU series of every GPU on the node, no engine "
    "series, /readyz 200 while the sidecar serves; --gpu-scope must then be node (the "
    "default there), and --probes and an admin token need an engine.",
)
@click.option("--listen", default=":9400", show_envvar=True, help="HOST:PORT to serve on.")
@engine_options
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
@click.option(
    "--pod",
    default=lambda: os.environ.get("POD_NAME", ""),
    show_envvar=True,
    help="Pod label of every series.",
    show_default="$POD_NAME (Kubernetes downward API)",
)
@click.option(
    "--namespace",
    default=lambda: os.environ.get("POD_NAMESPACE", ""),
    show_envvar=True,
    help="Namespace label of every series.",
    show_default="$POD_NAMESPACE",
)
@click.option(
    "--node",
    default=lambda: os.environ.get("NODE_NAME", ""),
    show_envvar=True,
    help="Node label of every series.",
    show_default="$NODE_NAME",
)
@click.option(
    "--gpu",
    default="auto",
    show_envvar=True,
    help="GPU telemetry: auto, nvml, dcgm=URL (a dcgm-exporter /metrics page), replay=DIR "
    "(a recorded NVML session) or none.",
)
@click.option(
    "--gpu-scope",
    default="auto",
    show_envvar=True,
    help="The GPUs this replica's engine uses, whose series are served and whose faults fail "
    "/readyz: kubelet (this pod's allocation, from the kubelet PodResources API), a device "
    "list (GPU-uuid, MIG-uuid, index or nvidiaN, comma-separated: the engine's "
    "CUDA_VISIBLE_DEVICES value works as it is), all (every GPU the sidecar sees), or node "
    "(every GPU, readiness never gated: node-wide reading, one sidecar per node). auto: "
    "kubelet in Kubernetes, "
    "else $CUDA_VISIBLE_DEVICES when set, else all; node without --engine-url.",
)
@click.option(
    "--kubelet-socket",
    type=click.Path(dir_okay=False, path_type=Path),
    default=scope.KUBELET_SOCKET,
    show_envvar=True,
    show_default=True,
    help="The kubelet's PodResources socket (mount its directory into the sidecar).",
)
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
@click.option(
    "--probes",
    default="",
    show_envvar=True,
    help="Golden set (a shipped name such as 'default', or a YAML file) to probe the engine "
    "with; its verdict becomes the /readyz quality condition. Empty: no quality probes.",
)
@click.option(
    "--probe-cycle",
    type=click.FloatRange(min=1),
    default=300.0,
    show_envvar=True,
    help="Seconds over which one pass of the golden set is spread.",
)
@click.option(
    "--admin-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="File holding the bearer token of POST/DELETE /admin/isolation (the runbook "
    "receiver's replica isolation). Without it (or INFERWATCH_SIDECAR_ADMIN_TOKEN) the admin "
    "endpoint answers 403.",
)
@click.option(
    "--warmup-batch-sizes",
    default="",
    callback=int_list,
    show_envvar=True,
    help="Warm-up gate: batch sizes (comma-separated, e.g. 1,8,32) at which the sidecar sends "
    "warm-up requests to the engine's /v1/completions once it is healthy, each batch at once, "
    "before /readyz may turn ready (readiness condition warmup). Empty (the default): no "
    "warm-up, the replica is ready as soon as the engine is.",
)
@click.option(
    "--warmup-prompt-tokens",
    default="16,1024",
    callback=int_list,
    show_envvar=True,
    show_default=True,
    help="Prompt lengths (about one token per word) sent at every warm-up batch size: a short "
    "one and a long one that allocates KV cache. Each must fit the model's context.",
)
@click.option(
    "--warmup-max-tokens",
    type=click.IntRange(1, 64),
    default=4,
    show_envvar=True,
    show_default=True,
    help="max_tokens of each warm-up request.",
)
@click.option(
    "--warmup-deadline",
    type=click.FloatRange(min=1),
    default=120.0,
    show_envvar=True,
    show_default=True,
    help="Seconds one warm-up round may take; a round that fails or overruns keeps the replica "
    "unready with the reason, and is retried with backoff (2s doubling to 60s).",
)
def sidecar(
    engine_url: str | None,
    listen: str,
    engine: str,
    engine_timeout: float,
    max_page_bytes: int,
    max_series_per_family: int,
    max_label_length: int,
    model: str,
    model_version: str,
    engine_version: str,
    prompt_version: str,
    pod: str,
    namespace: str,
    node: str,
    gpu: str,
    gpu_scope: str,
    kubelet_socket: Path,
    pod_labels: str,
    probes: str,
    probe_cycle: float,
    admin_token_file: Path | None,
    warmup_batch_sizes: tuple[int, ...],
    warmup_prompt_tokens: tuple[int, ...],
    warmup_max_tokens: int,
    warmup_deadline: float,
) -> None:
    """Serve one canonical /metrics, /healthz and /readyz for one engine replica.

    Each scrape of /metrics scrapes the engine, maps its metrics onto inferwatch's schema and
    adds GPU telemetry. When the engine does not answer, the sidecar keeps serving: /metrics
    reports inferwatch_engine_up 0 with the failure reason counted, and /readyz answers 503.
    Without --engine-url it serves the node's GPU telemetry only.
    """
    host, port = parse_listen(listen)
    try:
        admin_token = load_token(
            os.environ.get("INFERWATCH_SIDECAR_ADMIN_TOKEN"), admin_token_file, what="admin token"
        )
    except TokenError as exc:
        raise click.BadParameter(str(exc), param_hint="--admin-token-file") from None
    if engine_url is None:
        if warmup_batch_sizes:
            raise click.UsageError("--warmup-batch-sizes needs --engine-url: warm-up goes to it")
        gpu_scope = _gpu_only_scope(gpu, gpu_scope, probes, admin_token)
    emit_pod = emits_pod_labels(pod_labels, os.environ)
    identity = {
        "model": model,
        "model_version": model_version,
        "engine_version": engine_version,
        "prompt_version": prompt_version,
        **({"pod": pod, "namespace": namespace, "node": node} if emit_pod else {}),
    }
    url = metrics_url(engine_url) if engine_url is not None else None
    engine_collector = None
    if url is not None:
        engine_collector = EngineCollector(
            EngineScraper(url, timeout_s=engine_timeout, max_bytes=max_page_bytes),
            identity,
            engine=None if engine == "auto" else engine,
            limits=Limits(max_series_per_family, max_label_length),
        )
    gpus = _gpu_scope(gpu_scope, kubelet_socket, pod, namespace) if gpu != "none" else None
    gpu_backend = _gpu_backend(gpu, gpus)
    collectors: list[MetricSource] = [gpu_backend]
    readiness: list[ReadinessSource] = [gpu_backend]
    background = []
    runner = None
    if probes and engine_collector is not None:  # probes without an engine: refused above
        runner = _probe_runner(probes, probe_cycle, engine_collector.base_url, identity, pod)
        collectors.append(runner)
        readiness.append(runner)
    if engine_collector is not None:
        plan = None
        if warmup_batch_sizes:
            plan = _warmup_plan(
                warmup_batch_sizes, warmup_prompt_tokens, warmup_max_tokens, warmup_deadline
            )
        tracker = _startup_tracker(engine_collector, plan, model, runner)
        collectors.append(tracker)
        readiness.append(tracker)
        background.append(tracker.run)
        if runner is not None:  # a replica still loading or warming up says nothing of quality
            background.append(partial(tracker.after_warmup, runner.run))
    app = Sidecar(
        engine_collector, collectors, readiness, background=background, admin_token=admin_token
    ).app()
    log_event(
        logger,
        logging.INFO,
        "sidecar starting"
        if url
        else "sidecar starting in GPU-only mode: no --engine-url, "
        "serving GPU telemetry of every GPU on the node, no engine series, /readyz not gated",
        listen=f"{host}:{port}",
        engine_url=url or "none",
        gpu=gpu,
        gpu_scope=str(gpu_backend.scope),
        pod_labels="emitted" if emit_pod else "left to service discovery",
    )
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


def emits_pod_labels(choice: str, environ: Mapping[str, str]) -> bool:
    """Whether series carry pod, namespace and node (``--pod-labels``).

    In Kubernetes a PodMonitor or ServiceMonitor already gives every series the target's
    namespace and pod (and node, by relabeling); labels of the same name on the page would
    be renamed exported_pod and so on, and break joins with every other pod metric.
    """
    return choice == "emit" or (choice == "auto" and not environ.get("KUBERNETES_SERVICE_HOST"))


def _gpu_only_scope(gpu_spec: str, gpu_scope: str, probes: str, admin_token: str | None) -> str:
    """The GPU scope of a sidecar without an engine, or the one-line reason it cannot run.

    Such a sidecar serves no traffic: it reads every GPU of its node, gates no readiness on
    them, and has no engine to probe or replica to isolate.
    """
    if gpu_spec.strip() == "none":
        raise click.UsageError("--gpu none without --engine-url leaves nothing to serve")
    if probes:
        raise click.UsageError("--probes needs --engine-url: quality probes go to the engine")
    if admin_token is not None:
        raise click.UsageError(
            "an admin token needs --engine-url: a GPU-only sidecar serves no traffic, so it "
            "has no replica to isolate"
        )
    if gpu_scope not in ("auto", "node"):
        raise click.UsageError(
            f"--gpu-scope {gpu_scope} needs --engine-url: without an engine the sidecar reads "
            "every GPU of the node and gates no readiness on them (--gpu-scope node)"
        )
    return "node"


def _gpu_scope(value: str, socket: Path, pod: str, namespace: str) -> GpuScope:
    try:
        return scope.resolve(value, pod=pod, namespace=namespace, environ=os.environ, socket=socket)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu-scope") from None


def _gpu_backend(spec: str, gpu_scope: GpuScope | None) -> GpuTelemetry:
    try:
        return gpu.open_backend(spec, scope=gpu_scope)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None


#: the largest warm-up batch (vLLM captures CUDA graphs up to 512) and prompt
MAX_WARMUP_BATCH = 1024
MAX_WARMUP_PROMPT = 131072


def _warmup_plan(
    batch_sizes: tuple[int, ...], prompt_tokens: tuple[int, ...], max_tokens: int, deadline: float
) -> WarmupPlan:
    if max(batch_sizes) > MAX_WARMUP_BATCH:
        raise click.BadParameter(
            f"a warm-up batch is at most {MAX_WARMUP_BATCH} requests",
            param_hint="--warmup-batch-sizes",
        )
    if not prompt_tokens or max(prompt_tokens) > MAX_WARMUP_PROMPT:
        raise click.BadParameter(
            f"give one to a few prompt lengths of at most {MAX_WARMUP_PROMPT} tokens",
            param_hint="--warmup-prompt-tokens",
        )
    return WarmupPlan(batch_sizes, prompt_tokens, max_tokens, deadline)


def _startup_tracker(
    engine: EngineCollector, plan: WarmupPlan | None, model: str, runner: ProbeRunner | None
) -> StartupTracker:
    """The cold-start phases, with the warm-up gate when one is planned; the sidecar's own
    probes are subtracted from the engine's requests to find the first client's."""
    warmup = Warmup(plan, engine.base_url, model) if plan is not None else None
    probes_sent = (lambda: sum(runner.metrics.runs.values())) if runner else (lambda: 0)
    return StartupTracker(engine, warmup, own_requests=probes_sent)


def _probe_runner(
    goldens: str, cycle: float, engine_base_url: str, identity: dict[str, str], pod: str
) -> ProbeRunner:
    """Quality probes sent straight to this replica's engine."""
    try:
        golden_set = golden.load(goldens)
    except golden.GoldenError as exc:
        raise click.BadParameter(str(exc), param_hint="--probes") from None
    target = Target(
        name=pod or "local",
        endpoint=Endpoint(engine_base_url, identity["model"]),
        route="direct",
        model_version=identity["model_version"],
    )
    return ProbeRunner(golden_set, [target], schedule=Schedule(cycle_s=cycle))


@click.command()
@click.argument("url")
@engine_options
def scrape(
    url: str,
    engine: str,
    engine_timeout: float,
    max_page_bytes: int,
    max_series_per_family: int,
    max_label_length: int,
) -> None:
    """Print the canonical view of one scrape of the engine at URL, as a table."""
    logging.getLogger("inferwatch.engine").setLevel(logging.ERROR)  # the error below says it
    collector = EngineCollector(
        EngineScraper(metrics_url(url), timeout_s=engine_timeout, max_bytes=max_page_bytes),
        {},
        engine=None if engine == "auto" else engine,
        limits=Limits(max_series_per_family, max_label_length),
    )

    async def once() -> Sequence[Metric]:
        try:
            return await collector.collect()
        finally:
            await collector.aclose()

    try:
        families = asyncio.run(once())
    except ScrapeFailure as failure:
        raise click.ClickException(f"scrape of {collector.scraper.url} failed: {failure}") from None
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
