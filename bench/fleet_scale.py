"""Fleet-scale benchmark: what the sidecar's metrics cost a Prometheus as the fleet grows.

Run from the repository root:
  .venv/bin/python bench/fleet_scale.py [--replicas 10,50,200] [--minutes 12] [--dashboard PATH]

Part 1, series per replica. A real ``inferwatch sidecar`` process in front of (a) the shared
vLLM 0.33.0 capture and a dcgm-exporter capture, served as static pages, and (b) the
simulator (``inferwatch sim``: engine page and its dcgm-exporter page, after some requests).
For each: series (sample lines) and bytes of the raw engine page plus the dcgm-exporter
page, against the sidecar's one /metrics page for the same replica.

Part 2, a backfilled fleet. The sidecar's page from (b) is the template of one replica; the
fleet is N copies with distinct pod, node, gpu_uuid, model and model_version labels (four
models, two versions each), scraped every 15 s over the last ``--minutes``: counters and
histograms grow at a replica-specific rate (every bucket of a replica by the same factor, so
buckets stay monotonic), gauges keep their value. ``promtool tsdb create-blocks-from
openmetrics`` writes the blocks; a real Prometheus opens them with the generated rule files
(alerts/generated/*.yaml) and evaluates them every 15 s. Rows per fleet size: series, TSDB
bytes per replica-hour (block size over replica-hours; blocks this short compress worse
than 2 h blocks, so this is an upper bound), each rule group's evaluation time (Prometheus'
own ``evaluationTime``, median of three evaluations), and each fleet-overview panel's query
time (Prometheus' ``stats=all`` execution time of an instant query, median of five) as the
dashboard has it and with every recorded series replaced by the raw expression its rule
records (recursively), below the floor: the execution time of ``vector(1)``, a query
that reads no series. Then the same pairs as range queries over the backfilled span (from
where a 5m window is full, one step per scrape interval: what a time-series panel sends),
the recorded series backfilled for that span by ``promtool tsdb create-blocks-from rules``.
Panels on series the fleet does not have (``up``, ``ALERTS``) are left out.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml
from localfleet import (
    CLUSTERS,
    MODELS,
    RULE_FILES,
    panel_queries,
    panels_by_cluster,
    prometheus,
    sidecar,
    static_pages,
    two_clusters,
    wait_for,
)

from inferwatch.serving import textformat
from inferwatch.sim.server import start_subprocess

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "fixtures"
ENGINE_CAPTURE = SHARED / "engines" / "vllm-generated-0.33.0-1engine.prom"
DCGM_CAPTURE = SHARED / "gpu" / "dcgm" / "dcgm-rtx4000ada-k8s-pod.prom"
STEP = 15
RECORDED = re.compile(r"\b([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+)(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def series(page: str) -> int:
    return sum(1 for line in page.splitlines() if line and not line.startswith("#"))


def sidecar_page(engine_url: str, dcgm_url: str) -> str:
    with sidecar(engine_url, dcgm_url) as url:
        httpx.get(f"{url}/metrics", timeout=10)  # first scrape fills state
        return httpx.get(f"{url}/metrics", timeout=10).text


def capture_page() -> tuple[str, str]:
    """The shared vLLM 0.33.0 and dcgm-exporter captures (one page), and a real sidecar's
    page in front of them."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copy(ENGINE_CAPTURE, folder / "engine")
        shutil.copy(DCGM_CAPTURE, folder / "dcgm")
        with static_pages(folder) as base:
            page = sidecar_page(f"{base}/engine", f"{base}/dcgm")
    return ENGINE_CAPTURE.read_text() + DCGM_CAPTURE.read_text(), page


def per_replica() -> tuple[list[tuple[str, int, int, int, int]], str]:
    """Rows (source, raw series, raw bytes, sidecar series, sidecar bytes) and the sidecar's
    page of the simulated replica (the fleet's template)."""
    raw, page = capture_page()
    rows = [("captures (vLLM 0.33.0 + dcgm-exporter)", series(raw), len(raw.encode()),
             series(page), len(page.encode()))]  # fmt: skip
    with start_subprocess() as simulator:
        sim = simulator.url
        for i in range(40):
            httpx.post(
                f"{sim}/v1/chat/completions",
                json={"model": "meta-llama/Llama-3.1-8B-Instruct", "max_tokens": 24,
                      "messages": [{"role": "user", "content": f"question {i}"}]},
                timeout=60,
            )  # fmt: skip
        raw = httpx.get(f"{sim}/metrics").text + httpx.get(f"{sim}/gpu/metrics").text
        page = sidecar_page(sim, f"{sim}/gpu/metrics")
    rows.append(("simulator (vLLM page + its dcgm-exporter page)", series(raw),
                 len(raw.encode()), series(page), len(page.encode())))  # fmt: skip
    return rows, page


def fleet_openmetrics(template: str, replicas: int, minutes: int, end: float, out: Path) -> int:
    """Write the fleet's samples as OpenMetrics to ``out``; returns the number of series."""
    exposition = textformat.parse(template)
    growing = {"counter", "histogram", "summary"}
    samples = [
        (s.name, s.labels, s.value, family.type in growing)
        for family in exposition.families.values()
        for s in family.samples
    ]
    rng = random.Random(0)
    fleet = []
    for i in range(replicas):
        identity = {
            "namespace": "inference", "pod": f"{MODELS[i % 4]}-{i:04d}",
            "node": f"node-{i // 8:03d}", "model": MODELS[i % 4],
            "model_version": f"v{(i // 4) % 2}", "cluster": "c1",
            "instance": f"10.0.{i // 250}.{i % 250}:9400", "job": "inference/llama-inferwatch",
        }  # fmt: skip
        rate = rng.uniform(0.5, 1.5)
        for name, labels, value, grows in samples:
            merged = {**labels, **identity}
            if "gpu_uuid" in merged:
                merged["gpu_uuid"] = f"GPU-{i:04d}-{merged['gpu_uuid'][-8:]}"
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(merged.items()))
            fleet.append((f"{name}{{{text}}}", value * rate, grows))
    steps = minutes * 60 // STEP
    with out.open("w", encoding="utf-8") as handle:
        for step in range(steps + 1):
            t = end - (steps - step) * STEP
            growth = 1 + step / steps  # counters double over the span
            handle.writelines(
                f"{key} {value * growth if grows else value:.6g} {t:.3f}\n"
                for key, value, grows in fleet
            )
        handle.write("# EOF\n")
    return len(fleet)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def recording_rules() -> dict[str, list[tuple[dict[str, str], str]]]:
    """record name -> [(static labels, expr)] from the generated rule files."""
    rules: dict[str, list[tuple[dict[str, str], str]]] = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    rules.setdefault(rule["record"], []).append(
                        ({k: str(v) for k, v in (rule.get("labels") or {}).items()}, rule["expr"])
                    )
    return rules


def recording_levels() -> list[list[dict[str, Any]]]:
    """The generated recording rules in dependency order: level 0 reads only scraped series,
    level N reads series of level N-1 or below."""
    found = [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]
    depth: dict[str, int] = {}
    while len(depth) < len({r["record"] for r in found}):
        for rule in found:
            reads = {name for name, _ in RECORDED.findall(rule["expr"])}
            if reads <= set(depth):
                level = 1 + max((depth[name] for name in reads), default=-1)
                depth[rule["record"]] = max(depth.get(rule["record"], 0), level)
    levels: list[list[dict[str, Any]]] = [[] for _ in range(max(depth.values()) + 1)]
    for rule in found:
        levels[depth[rule["record"]]].append(rule)
    return levels


def serve_args(config: Path, data: Path, port: int) -> list[str]:
    """A Prometheus serving the blocks in ``data`` (30 days kept) on ``port``."""
    return [
        "prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d",
    ]  # fmt: skip


def backfill_recordings(data: Path, work: Path, start: float, end: float) -> float:
    """Write the recording rules' output over ``[start, end]`` into ``data`` with ``promtool
    tsdb create-blocks-from rules``, one level at a time: promtool evaluates each rule
    against a running Prometheus, which must already hold what the rule reads. Returns the
    seconds it took."""
    started = time.monotonic()
    config = work / "no-rules.yml"
    config.write_text(yaml.safe_dump({"global": {}}))
    for index, level in enumerate(recording_levels()):
        rules = work / f"level-{index}.yaml"
        rules.write_text(yaml.safe_dump({"groups": [{"name": f"level-{index}", "rules": level}]}))
        out = work / f"level-{index}"
        with prometheus(partial(serve_args, config, data), work / f"level-{index}.log") as api:
            subprocess.run(
                ["promtool", "tsdb", "create-blocks-from", "rules", f"--start={int(start)}",
                 f"--end={int(end)}", f"--url={api}", f"--output-dir={out}",
                 f"--eval-interval={STEP}s", str(rules)],
                check=True, capture_output=True,
            )  # fmt: skip
        for block in out.iterdir():
            block.rename(data / block.name)
    return time.monotonic() - started


def range_seconds(api: str, expr: str, start: float, end: float, rounds: int = 3) -> float:
    """Median execution time of ``expr`` as a time-series panel asks for it: a range query,
    one step per scrape interval."""
    times = []
    for _ in range(rounds):
        params = {"query": expr, "start": start, "end": end, "step": STEP, "stats": "all"}
        body = httpx.get(f"{api}/api/v1/query_range", params=params, timeout=300).json()
        if body.get("status") != "success":
            raise SystemExit(f"range query failed: {expr}\n{body.get('error')}")
        times.append(body["data"]["stats"]["timings"]["execTotalTime"])
    return statistics.median(times)


def expand(expr: str, rules: dict[str, list[tuple[dict[str, str], str]]]) -> str:
    """``expr`` with every recorded series replaced by the expression its rule records."""

    def replace(match: re.Match[str]) -> str:
        name, selector = match.group(1), match.group(2) or ""
        if name not in rules:
            return match.group(0)
        wanted = {k: v for k, op, v in MATCHER.findall(selector) if op == "="}
        candidates = [
            e for labels, e in rules[name] if all(wanted.get(k, v) == v for k, v in labels.items())
        ]
        inner = " or ".join(f"({expand(e, rules)})" for e in candidates)
        return f"({inner})"

    return RECORDED.sub(replace, expr)


def query_seconds(api: str, expr: str, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        reply = httpx.get(
            f"{api}/api/v1/query", params={"query": expr, "stats": "all"}, timeout=120
        )
        body = reply.json()
        if body.get("status") != "success":
            raise SystemExit(f"query failed: {expr}\n{body.get('error')}")
        times.append(body["data"]["stats"]["timings"]["execTotalTime"])
    return statistics.median(times)


def _evaluated_at(api: str, expr: str) -> str:
    """When the group recording the first recorded series in ``expr`` last ran: at that
    instant the recorded series and the raw expression see the same samples."""
    (name, _), *_ = RECORDED.findall(expr)
    for group in httpx.get(f"{api}/api/v1/rules", timeout=30).json()["data"]["groups"]:
        if any(rule.get("name") == name for rule in group["rules"]):
            return str(group["lastEvaluation"])
    raise SystemExit(f"no rule group records {name}")


def _values(api: str, expr: str, at: str) -> list[float]:
    """The result's values at ``at``, sorted (compared within 1%: a recorded series read by a
    rule of another group was evaluated a little earlier)."""
    reply = httpx.get(f"{api}/api/v1/query", params={"query": expr, "time": at}, timeout=120).json()
    return sorted(float(item["value"][1]) for item in reply["data"]["result"])


def measure_fleet(
    template: str, replicas: int, minutes: int, queries: list[tuple[str, str]], work: Path
) -> dict[str, Any]:
    rules = recording_rules()
    data = work / f"tsdb-{replicas}"
    source = work / f"fleet-{replicas}.om"
    end = time.time()
    count = fleet_openmetrics(template, replicas, minutes, end, source)
    started = time.monotonic()
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True, capture_output=True,
    )  # fmt: skip
    backfill_s = time.monotonic() - started
    source.unlink()
    block_bytes = du(data)
    # the recorded series over the same span, so that a range query finds both forms
    start = end - minutes * 60 + 5 * 60  # from where a 5m rate window is full
    rules_backfill_s = backfill_recordings(data, work, start, end)
    config = work / f"prometheus-{replicas}.yml"
    config.write_text(yaml.safe_dump({
        "global": {"evaluation_interval": f"{STEP}s", "external_labels": {}},
        "rule_files": [str(p) for p in RULE_FILES],
    }))  # fmt: skip
    with prometheus(partial(serve_args, config, data), work / f"prometheus-{replicas}.log") as api:
        groups = rule_group_times(api)
        counted = httpx.get(
            f"{api}/api/v1/query", params={"query": 'count({__name__=~"inferwatch_.+"})'}
        ).json()["data"]["result"]
        # the execution time of a query that reads nothing: no panel can answer faster
        floor = query_seconds(api, "vector(1)")
        panels = []
        ranges: list[tuple[float, float | None]] = []
        for title, expr in queries:
            raw = expand(expr, rules)
            drawn_range = range_seconds(api, expr, start, end)
            if raw == expr:
                ranges.append((drawn_range, None))
                panels.append((title, query_seconds(api, expr), None, True))
                continue
            ranges.append((drawn_range, range_seconds(api, raw, start, end)))
            at = _evaluated_at(api, expr)
            drawn_values, raw_values = _values(api, expr, at), _values(api, raw, at)
            same = len(drawn_values) == len(raw_values) and all(
                math.isclose(a, b, rel_tol=0.01) or a == b or (a != a and b != b)
                for a, b in zip(drawn_values, raw_values, strict=True)
            )
            if not same:
                print(f"# {title}: {drawn_values} != {raw_values}", file=sys.stderr)
            panels.append((title, query_seconds(api, expr), query_seconds(api, raw), same))
    return {
        "replicas": replicas,
        "series": count,
        "series_in_prometheus": int(float(counted[0]["value"][1])) if counted else 0,
        "bytes_per_replica_hour": block_bytes / (replicas * minutes / 60),
        "backfill_s": backfill_s,
        "groups": groups,
        "floor": floor,
        "panels": panels,
        "ranges": ranges,
        "range_minutes": (end - start) / 60,
        "rules_backfill_s": rules_backfill_s,
    }


def rule_group_times(api: str, evaluations: int = 3, deadline_s: float = 300) -> dict[str, float]:
    """Median ``evaluationTime`` of each rule group over ``evaluations`` distinct runs."""
    seen: dict[str, dict[str, float]] = {}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for group in httpx.get(f"{api}/api/v1/rules", timeout=30).json()["data"]["groups"]:
            if not group["lastEvaluation"].startswith("0001"):
                seen.setdefault(group["name"], {})[group["lastEvaluation"]] = group[
                    "evaluationTime"
                ]
        if (
            seen
            and all(len(v) >= evaluations for v in seen.values())
            and len(seen) >= len(RULE_FILES)
        ):
            return {name: statistics.median(v.values()) for name, v in sorted(seen.items())}
        time.sleep(2)
    raise SystemExit(f"rule groups did not evaluate {evaluations} times within {deadline_s} s")


def multi_cluster(
    template: str, queries: list[tuple[str, str]], replicas: int, work: Path
) -> list[tuple[str, dict[str, dict[str, int]]]]:
    """Two clusters in one central store (``localfleet.two_clusters``); per panel, the
    series each cluster contributes with ``$cluster`` set to both and to each alone."""
    with two_clusters(template, replicas, work) as central:
        # rate()[5m] needs two samples of each series in the store, recording rules one run
        wait_for(
            central,
            "count(count by (cluster) (model_version:inferwatch_engine_requests:rate5m))",
            2,
        )
        rule_group_times(central, evaluations=2)
        return panels_by_cluster(central, queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="10,50,200")
    parser.add_argument("--minutes", type=int, default=12)
    parser.add_argument(
        "--dashboard", type=Path, default=REPO / "dashboards" / "generated" / "fleet.json",
        help="the fleet-overview dashboard whose panels are timed",
    )  # fmt: skip
    parser.add_argument("--skip-fleet", action="store_true")
    parser.add_argument(
        "--multi-cluster", type=int, default=0, metavar="N",
        help="also run two clusters of N replicas remote-writing into a central Prometheus",
    )  # fmt: skip
    options = parser.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        subprocess.run(
            ["prometheus", "--version"], capture_output=True, text=True
        ).stdout.splitlines()[0]
    )
    rows, template = per_replica()
    print("\n## Series and bytes per replica\n")
    print("| source | raw series | raw bytes | sidecar series | sidecar bytes | series ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rs, rb, ss, sb in rows:
        print(f"| {name} | {rs} | {rb} | {ss} | {sb} | {ss / rs:.2f} |")
    queries = panel_queries(options.dashboard) if options.dashboard.is_file() else []
    if options.multi_cluster:
        # the clusters' own `up` is remote-written too; ALERTS depends on what fires
        every = panel_queries(options.dashboard, absent=("ALERTS",))
        with tempfile.TemporaryDirectory() as tmp:
            rows_mc = multi_cluster(template, every, options.multi_cluster, Path(tmp))
        print(f"\n## Two clusters of {options.multi_cluster} replicas in one central store\n")
        print("Series of each panel by cluster: `$cluster` = east|west, and each alone")
        print("(-1: a cluster's query returned another cluster's series).\n")
        print("| panel | east+west | east alone | west alone |")
        print("|---|---|---:|---:|")
        for title, counts in rows_mc:
            both = ", ".join(f"{k or '(none)'}: {v}" for k, v in sorted(counts["both"].items()))
            alone = [str(counts[c].get(c, 0)) if set(counts[c]) <= {c} else "-1" for c in CLUSTERS]
            print(f"| {title} | {both or 'none'} | " + " | ".join(alone) + " |")
    if options.skip_fleet:
        return
    if not queries:
        print(f"\n(no dashboard at {options.dashboard}: panel queries are not timed)")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for replicas in (int(r) for r in options.replicas.split(",")):
            results.append(measure_fleet(template, replicas, options.minutes, queries, Path(tmp)))
            shutil.rmtree(Path(tmp) / f"tsdb-{replicas}")
            print(f"# {replicas} replicas measured", file=sys.stderr)
    sizes = " | ".join(str(r["replicas"]) for r in results)
    print(f"\n## Fleet in one Prometheus ({options.minutes} min backfilled at {STEP} s)\n")
    print(f"| measure | {sizes} |")
    print("|---" * (len(results) + 1) + "|")
    print(
        "| series | "
        + " | ".join(f"{r['series']} ({r['series_in_prometheus']})" for r in results)
        + " |"
    )
    print(
        "| TSDB bytes per replica-hour | "
        + " | ".join(f"{r['bytes_per_replica_hour'] / 1024:.0f} KiB" for r in results)
        + " |"
    )
    print(
        "| promtool backfill (s) | " + " | ".join(f"{r['backfill_s']:.1f}" for r in results) + " |"
    )
    for group in results[0]["groups"]:
        print(
            f"| rule group {group} (ms) | "
            + " | ".join(f"{r['groups'].get(group, 0) * 1000:.1f}" for r in results)
            + " |"
        )
    print("\n## Fleet-overview panels: query time in ms, as drawn / raw expression (speed-up)")
    print("(!=: the raw expression's values differ from the recorded ones)\n")
    print(f"| panel | {sizes} |")
    print("|---" * (len(results) + 1) + "|")
    print(
        "| floor: `vector(1)` | " + " | ".join(f"{r['floor'] * 1000:.2f}" for r in results) + " |"
    )
    for index, (title, _) in enumerate(queries):
        cells = []
        for r in results:
            _, drawn, raw, same = r["panels"][index]
            cells.append(
                f"{drawn * 1000:.2f}"
                if raw is None
                else f"{drawn * 1000:.2f} / {raw * 1000:.2f} ({raw / max(drawn, 1e-9):.0f}x)"
                + ("" if same else " !=")
            )
        print(f"| {title} | " + " | ".join(cells) + " |")
    span = results[0]["range_minutes"]
    print(f"\n## The same panels as range queries over {span:.0f} min at {STEP} s steps, in ms")
    print("(as a time-series panel asks; recorded series backfilled by promtool)\n")
    print(f"| panel | {sizes} |")
    print("|---" * (len(results) + 1) + "|")
    print(
        "| promtool rules backfill (s) | "
        + " | ".join(f"{r['rules_backfill_s']:.1f}" for r in results)
        + " |"
    )
    for index, (title, _) in enumerate(queries):
        cells = []
        for r in results:
            drawn, raw = r["ranges"][index]
            cells.append(
                f"{drawn * 1000:.2f}"
                if raw is None
                else f"{drawn * 1000:.2f} / {raw * 1000:.2f} ({raw / max(drawn, 1e-9):.0f}x)"
            )
        print(f"| {title} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
