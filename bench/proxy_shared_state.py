"""Cost of fleet-wide budgets: the tenancy proxy with its budget in Redis, side by side with
the same proxy keeping it in its own memory.

    .venv/bin/python bench/proxy_shared_state.py [--requests 2000] [--rounds 3] [--engine-ms 0]
                                                 [--rate-limits]

One run starts the fast mock engine of ``proxy_overhead.py`` and a real ``redis-server`` on
loopback (append-only file fsynced every second, Redis's usual production setting), then
measures the same load three ways: direct to the mock, through ``inferwatch
proxy`` with a tenant budget in its own memory (``local``), and through the same proxy with
``shared_state`` on that Redis (``redis``: one reservation script before each request, its
settlement after the reply). The budget is far larger than the run spends, so every request
is admitted and reserved. ``--rate-limits`` gives the tenant requests- and tokens-per-minute
limits too large to refuse anything, so that every request also meets its rate buckets (in
Redis, checked by the reservation's own script). Both proxies run side by side and are
measured in turn, ``--rounds`` times, so that a neighbour's load on a shared machine falls on
both alike; each figure is the median of its rounds.

Reported: non-streamed latency p50/p99 at concurrency 1 and 16, throughput, the CPU a
request costs (the proxy's, and Redis's for ``redis``; a neighbour's load on the machine
moves it far less than throughput), the added p50 of the shared reservation at c=1 (redis -
local) and the c=16 throughput ratio redis / local, each against its target (at most 0.3 ms;
at least 0.80).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from proxy_overhead import (
    TENANT_KEY,
    _pct,
    _run_load,
    _serve_in_child,
    _serve_mock,
    _stop,
    start_proxy,
)

from support.redis import RedisServer  # proxy_overhead put tests/ on the path

CONCURRENCY = (1, 16)
#: the cost targets of shared state: the reservation's added p50, the c=16 throughput kept
ADDED_P50_MS = 0.3
THROUGHPUT_RATIO = 0.80
#: limits that refuse nothing in a run, so that every request meets its buckets
NEVER_LIMITING = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12}


def _config(
    workdir: Path, name: str, mock_port: int, shared: dict[str, Any] | None, rate_limits: bool
) -> Path:
    tenant: dict[str, Any] = {
        "key_sha256": [hashlib.sha256(TENANT_KEY.encode()).hexdigest()],
        "budget": {"tokens": 10**15, "window": "1h"},
    }
    if rate_limits:
        tenant["rate_limits"] = NEVER_LIMITING
    document: dict[str, Any] = {
        "upstream": {"url": f"http://127.0.0.1:{mock_port}", "reconcile_interval": 0},
        "tenants": {"bench": tenant},
        "prices": {"default": {"prompt": 0.5, "completion": 1.5}},
    }
    if shared is not None:
        document["shared_state"] = shared
    path = workdir / f"{name}.yaml"
    path.write_text(json.dumps(document))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--engine-ms", type=float, default=0.0, help="mock's ms per reply")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each, in turn")
    parser.add_argument(
        "--rate-limits", action="store_true", help="give the tenant (never refusing) rate limits"
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="shared-state-bench-"))
    mock, mock_port = _serve_in_child(_serve_mock, args.engine_ms / 1000)
    redis = RedisServer(workdir / "redis", fsync="everysec")  # AOF as production runs it
    rounds: dict[tuple[str, int], list[dict[str, Any]]] = {}
    processes = []
    try:
        ports = {"direct": mock_port}
        #: the processes whose CPU a request through each costs
        spenders: dict[str, list[int]] = {"direct": []}
        for name, shared in (
            ("local", None),
            ("redis", {"url": redis.address, "journal_dir": str(workdir)}),
        ):
            config = _config(workdir, name, mock_port, shared, args.rate_limits)
            process, ports[name] = start_proxy(config, TENANT_KEY, workdir / f"{name}.log", 30)
            processes.append(process)
            spenders[name] = [process.pid]
        assert redis.process is not None
        spenders["redis"].append(redis.process.pid)
        for _ in range(args.rounds):
            for concurrency in CONCURRENCY:
                for name, port in ports.items():
                    key = "none" if name == "direct" else TENANT_KEY
                    rounds.setdefault((name, concurrency), []).append(
                        _measure(name, port, key, concurrency, args, spenders[name])
                    )
        _report({run: _median(measured) for run, measured in rounds.items()})
    finally:
        for process in processes:
            _stop(process)
        redis.stop()
        mock.terminate()
        mock.join(5)
        shutil.rmtree(workdir, ignore_errors=True)


def _median(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """The round of median throughput (its latencies with it)."""
    return sorted(measured, key=lambda result: result["rps"])[len(measured) // 2]


def _cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds the processes have spent (``/proc/PID/stat``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    spent = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        spent += int(fields[11]) + int(fields[12])  # utime, stime
    return spent / ticks


def _measure(
    name: str,
    port: int,
    key: str,
    concurrency: int,
    args: argparse.Namespace,
    spenders: list[int],
) -> dict[str, Any]:
    """One load; with the CPU it cost the proxy (and Redis) per request, which a
    neighbour's load on the machine changes far less than the throughput."""
    print(f"  {name:7} c={concurrency:<2} ...", end="", flush=True)
    before = _cpu_s(spenders)
    result = _run_load(port, key, False, concurrency, args.requests)
    result["cpu_ms"] = (_cpu_s(spenders) - before) * 1000 / args.requests
    print(f" {result['rps']:8.0f} req/s {result['cpu_ms']:6.3f} CPU ms/req", flush=True)
    return result


def _report(results: dict[tuple[str, int], dict[str, Any]]) -> None:
    ms = 1000.0
    print()
    print(
        f"{'target':8} {'c':>2} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'vs local':>9} "
        f"{'CPU ms/req':>10} {'vs local':>9}"
    )
    for concurrency in CONCURRENCY:
        local = results[("local", concurrency)]
        for name in ("direct", "local", "redis"):
            r = results[(name, concurrency)]
            print(
                f"{name:8} {concurrency:>2} {_pct(r['total'], 0.5) * ms:8.3f} "
                f"{_pct(r['total'], 0.99) * ms:8.3f} {r['rps']:8.0f} "
                f"{r['rps'] / local['rps']:9.2f} {r['cpu_ms']:10.3f} "
                f"{r['cpu_ms'] / local['cpu_ms']:9.2f}"
            )
    print()
    added = _pct(results[("redis", 1)]["total"], 0.5) - _pct(results[("local", 1)]["total"], 0.5)
    ratio = results[("redis", 16)]["rps"] / results[("local", 16)]["rps"]
    print(
        f"added p50 of the shared reservation at c=1 (redis - local): {added * ms:.3f} ms "
        f"(target <= {ADDED_P50_MS} ms: {'met' if added * ms <= ADDED_P50_MS else 'NOT met'})"
    )
    print(
        f"throughput at c=16, redis / local: {ratio:.2f} "
        f"(target >= {THROUGHPUT_RATIO:.2f}: {'met' if ratio >= THROUGHPUT_RATIO else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
