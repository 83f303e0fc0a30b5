"""Cost of fleet-wide budgets: the tenancy proxy with its budget in Redis, side by side with
the same proxy keeping it in its own memory.

    .venv/bin/python bench/proxy_shared_state.py [--requests 2000] [--rounds 3] [--engine-ms 0]

One run starts the fast mock engine of ``proxy_overhead.py`` and a real ``redis-server`` on
loopback (append-only file fsynced every second, Redis's usual production setting), then
measures the same load three ways: direct to the mock, through ``inferwatch
proxy`` with a tenant budget in its own memory (``local``), and through the same proxy with
``shared_state`` on that Redis (``redis``: one reservation script before each request, its
settlement after the reply). The budget is far larger than the run spends, so every request
is admitted and reserved. Both proxies run side by side and are measured in turn, ``--rounds``
times, so that a neighbour's load on a shared machine falls on both alike; each figure is the
median of its rounds.

Reported: non-streamed latency p50/p99 at concurrency 1 and 16 and throughput at 16, the
added p50 of the shared reservation at c=1 (redis - local) and the c=16 throughput ratio
redis / local, each against its target (issue 24: at most 0.3 ms, at least 0.70).
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
#: issue 24's cost targets
ADDED_P50_MS = 0.3
THROUGHPUT_RATIO = 0.70


def _config(workdir: Path, name: str, mock_port: int, shared: dict[str, Any] | None) -> Path:
    document: dict[str, Any] = {
        "upstream": {"url": f"http://127.0.0.1:{mock_port}", "reconcile_interval": 0},
        "tenants": {
            "bench": {
                "key_sha256": [hashlib.sha256(TENANT_KEY.encode()).hexdigest()],
                "budget": {"tokens": 10**15, "window": "1h"},
            }
        },
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
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="shared-state-bench-"))
    mock, mock_port = _serve_in_child(_serve_mock, args.engine_ms / 1000)
    redis = RedisServer(workdir / "redis", fsync="everysec")  # AOF as production runs it
    rounds: dict[tuple[str, int], list[dict[str, Any]]] = {}
    processes = []
    try:
        ports = {"direct": mock_port}
        for name, shared in (
            ("local", None),
            ("redis", {"url": redis.address, "journal_dir": str(workdir)}),
        ):
            config = _config(workdir, name, mock_port, shared)
            process, ports[name] = start_proxy(config, TENANT_KEY, workdir / f"{name}.log", 30)
            processes.append(process)
        for _ in range(args.rounds):
            for concurrency in CONCURRENCY:
                for name, port in ports.items():
                    key = "none" if name == "direct" else TENANT_KEY
                    rounds.setdefault((name, concurrency), []).append(
                        _measure(name, port, key, concurrency, args)
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


def _measure(
    name: str, port: int, key: str, concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    print(f"  {name:7} c={concurrency:<2} ...", end="", flush=True)
    result = _run_load(port, key, False, concurrency, args.requests)
    print(f" {result['rps']:8.0f} req/s", flush=True)
    return result


def _report(results: dict[tuple[str, int], dict[str, Any]]) -> None:
    ms = 1000.0
    print()
    print(f"{'target':8} {'c':>2} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'vs local':>9}")
    for concurrency in CONCURRENCY:
        local = results[("local", concurrency)]
        for name in ("direct", "local", "redis"):
            r = results[(name, concurrency)]
            print(
                f"{name:8} {concurrency:>2} {_pct(r['total'], 0.5) * ms:8.3f} "
                f"{_pct(r['total'], 0.99) * ms:8.3f} {r['rps']:8.0f} "
                f"{r['rps'] / local['rps']:9.2f}"
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
