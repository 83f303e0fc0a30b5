"""A fleet on loopback: sidecar pages, replicas that serve them, and Prometheus servers.

Shared by ``bench/fleet_scale.py`` (which measures with it) and ``tests/test_multicluster.py``
(which checks the kit's multi-cluster setup with it). Everything here is a real process or a
real HTTP server: the ``inferwatch sidecar``, ``prometheus`` with the generated rule files,
and a page server standing in for many replicas, each with its own identity labels.

The multi-cluster topology: two Prometheus servers, each configured from the kit's
multi-cluster overlay (``overlays/multi-cluster-east/prometheus-values.yaml``: the ``cluster``
external label and the remote write with its queue settings, the URL pointed at a local
store, the second server with ``cluster: west``), scrape their cluster's replicas and
remote-write into a third started with ``--web.enable-remote-write-receiver``, which
evaluates the generated rules.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from inferwatch.serving import threaded

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.ports import announced_url, launch  # noqa: E402  (the tests' port tools)

#: the console script of the interpreter running this (the project's virtual environment)
INFERWATCH = Path(sys.executable).parent / "inferwatch"
RULE_FILES = sorted((REPO / "alerts" / "generated").glob("*.yaml"))
FLEET_DASHBOARD = REPO / "dashboards" / "generated" / "fleet.json"
SITE_VALUES = REPO / "deploy/kubernetes/overlays/multi-cluster-east/prometheus-values.yaml"
MODELS = ("llama-8b", "llama-70b", "qwen-32b", "mixtral-8x7b")
CLUSTERS = ("east", "west")


def wait_http(url: str, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {deadline_s:.0f} s")


@contextlib.contextmanager
def stopped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """``proc`` running until the block ends."""
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def prometheus(args: Callable[[int], list[str]], log: Path) -> Iterator[str]:
    """A ``prometheus`` whose command line is ``args(port)``, on a free port (another one when
    it was taken before Prometheus bound it); its URL once ready, until the block ends."""
    proc, url = launch(args, log, "/-/ready", "prometheus", timeout=60)
    with stopped(proc):
        yield url


@contextlib.contextmanager
def static_pages(folder: Path) -> Iterator[str]:
    """The files of ``folder`` over HTTP (a file added later is served from then on)."""
    with threaded.serving(partial(_QuietHandler, directory=str(folder))) as url:
        yield url


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def sidecar(engine_url: str, dcgm_url: str) -> Iterator[str]:
    """A real ``inferwatch sidecar`` in front of an engine page and a dcgm-exporter page;
    yields its base URL. Identity labels are left to service discovery (``--pod-labels
    omit``), as the fleet pages add their own."""
    args = [
        str(INFERWATCH), "sidecar", f"--engine-url={engine_url}", "--listen=127.0.0.1:0",
        f"--gpu=dcgm={dcgm_url}", "--gpu-scope=all", "--pod-labels=omit",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="localfleet-") as folder:
        log = Path(folder) / "sidecar.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        with stopped(proc):
            url = announced_url(proc, log, "the sidecar")
            wait_http(f"{url}/healthz")
            yield url


class FleetPages(ThreadingHTTPServer):
    """``/CLUSTER/INDEX`` serves replica INDEX of a cluster: the template with its own pod,
    node and model labels (as ``--pod-labels emit`` writes them), counters growing with
    time. Runs in a daemon thread from construction to :meth:`close`."""

    daemon_threads = True

    def __init__(self, template: str) -> None:
        super().__init__(("127.0.0.1", 0), _FleetHandler)
        self.template = template
        self.started = time.monotonic()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _FleetHandler(SimpleHTTPRequestHandler):
    server: FleetPages

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        _, cluster, index = self.path.split("/")
        i = int(index)
        growth = 1 + (time.monotonic() - self.server.started) / 60
        identity = (
            f'namespace="inference",pod="{cluster}-{MODELS[i % 4]}-{i}",node="{cluster}-node-{i}",'
            f'instance="{cluster}-{i}:9400",'
        )
        lines = []
        for line in self.server.template.splitlines():
            if not line or line.startswith("#"):
                lines.append(line)
                continue
            series, _, value = line.rpartition(" ")
            name, brace, rest = series.partition("{")
            labels = rest[:-1] if brace else ""
            labels = re.sub(r'\b(pod|namespace|node|instance)="[^"]*",?', "", labels)
            labels = re.sub(r'model="[^"]*"', f'model="{MODELS[i % 4]}"', labels)
            labels = re.sub(r'gpu_uuid="([^"]*)"', rf'gpu_uuid="{cluster}-{i}-\1"', labels)
            grows = name.endswith(("_total", "_bucket", "_sum", "_count"))
            number = float(value) * (growth if grows else 1)
            lines.append(f"{name}{{{identity}{labels}}} {number:.6g}")
        body = "\n".join(lines).encode() + b"\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def panel_queries(
    dashboard: Path = FLEET_DASHBOARD, absent: tuple[str, ...] = ("up", "ALERTS")
) -> list[tuple[str, str]]:
    """(title [index], expr) of every panel query, variables as ``.*`` and
    ``$__rate_interval`` as 1m; queries on the series named in ``absent`` are left out."""
    board = json.loads(dashboard.read_text())
    skip = re.compile(r"\b(" + "|".join(absent) + r")\{") if absent else None
    found = []
    for panel in board.get("panels", []):
        for index, target in enumerate(panel.get("targets", [])):
            expr = target.get("expr", "")
            if not expr or (skip and skip.search(expr)):
                continue
            expr = re.sub(r"\$__rate_interval", "1m", expr)
            expr = re.sub(r"\$\w+", ".*", expr)
            found.append((f"{panel['title']} [{index}]", expr))
    return found


@contextlib.contextmanager
def two_clusters(template: str, replicas: int, work: Path, interval: str = "5s") -> Iterator[str]:
    """East and west, ``replicas`` each, remote-writing into a central Prometheus that
    evaluates the generated rules every ``interval``; yields the central API's URL."""
    values = yaml.safe_load(SITE_VALUES.read_text())["prometheus"]["prometheusSpec"]
    pages = FleetPages(template)
    try:
        with contextlib.ExitStack() as stack:
            config = work / "central.yml"
            config.write_text(yaml.safe_dump({
                "global": {"evaluation_interval": interval},
                "rule_files": [str(p) for p in RULE_FILES],
            }))  # fmt: skip
            central = stack.enter_context(prometheus(lambda port: [
                "prometheus", f"--config.file={work / 'central.yml'}",
                f"--storage.tsdb.path={work / 'central'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-remote-write-receiver",
            ], work / "central.log"))  # fmt: skip
            for cluster in CLUSTERS:
                config = work / f"{cluster}.yml"
                config.write_text(yaml.safe_dump(cluster_config(
                    values, cluster, f"{central}/api/v1/write", pages.address, replicas, interval
                )))  # fmt: skip
                stack.enter_context(prometheus(partial(cluster_args, work, cluster),
                                               work / f"{cluster}.log"))  # fmt: skip
            yield central
    finally:
        pages.close()


def cluster_args(work: Path, cluster: str, port: int) -> list[str]:
    """The command line of ``cluster``'s Prometheus, listening on ``port``."""
    return [
        "prometheus", f"--config.file={work / f'{cluster}.yml'}",
        f"--storage.tsdb.path={work / cluster}", f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip


def cluster_config(
    spec: dict[str, Any], cluster: str, url: str, pages: str, replicas: int, interval: str
) -> dict[str, Any]:
    """A cluster's prometheus.yml from the kit's ``prometheusSpec`` (the operator writes the
    same fields from it): its external labels with this cluster's name, its remote write
    with the URL replaced and its queue settings (the batch deadline cut to 1 s, so that a
    short run sees samples soon), and a scrape job over the replicas."""
    remote = spec["remoteWrite"][0]
    queue = remote.get("queueConfig", {})
    return {
        "global": {
            "scrape_interval": interval,
            "external_labels": {**spec["externalLabels"], "cluster": cluster},
        },
        "remote_write": [{
            "url": url,
            "queue_config": {
                "capacity": queue["capacity"], "max_shards": queue["maxShards"],
                "max_samples_per_send": queue["maxSamplesPerSend"],
                "batch_send_deadline": "1s",
            },
        }],
        "scrape_configs": [{
            "job_name": "inference/llama-inferwatch",
            "honor_labels": True,
            "scrape_interval": interval,
            "static_configs": [
                {"targets": [pages], "labels": {"__metrics_path__": f"/{cluster}/{i}"}}
                for i in range(replicas)
            ],
        }],
    }  # fmt: skip


def wait_for(api: str, expr: str, value: float, deadline_s: float = 240) -> None:
    """Until the first sample of ``expr`` is at least ``value``."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        result = httpx.get(f"{api}/api/v1/query", params={"query": expr}, timeout=30).json()
        found = result["data"]["result"]
        if found and float(found[0]["value"][1]) >= value:
            return
        time.sleep(1)
    raise TimeoutError(f"{expr} did not reach {value} within {deadline_s} s")


def series_by_cluster(api: str, expr: str) -> dict[str, int]:
    """Series of the instant query ``expr``, counted per value of ``cluster``."""
    reply = httpx.get(f"{api}/api/v1/query", params={"query": expr}, timeout=60).json()
    if reply.get("status") != "success":
        raise ValueError(f"query failed: {expr}: {reply.get('error')}")
    counts: dict[str, int] = {}
    for item in reply["data"]["result"]:
        cluster = item["metric"].get("cluster", "")
        counts[cluster] = counts.get(cluster, 0) + 1
    return counts


def panels_by_cluster(
    api: str, queries: list[tuple[str, str]]
) -> list[tuple[str, dict[str, dict[str, int]]]]:
    """Per panel query, the series per cluster with ``$cluster`` set to both clusters
    (``both``) and to each one alone (keyed by its name)."""
    rows = []
    for title, expr in queries:
        counts = {
            "both": series_by_cluster(api, expr.replace('cluster=~".*"', 'cluster=~"east|west"'))
        }
        for cluster in CLUSTERS:
            counts[cluster] = series_by_cluster(
                api, expr.replace('cluster=~".*"', f'cluster="{cluster}"')
            )
        rows.append((title, counts))
    return rows
