"""Overhead of the tenancy proxy in front of a real vLLM, as ratios to calling vLLM directly.

    .venv/bin/python bench/proxy_real_engine.py [--rounds 6] [--requests 16] [--engine-url URL]

Without ``--engine-url`` the script starts vLLM's CPU build (``scripts/install-vllm``) on the
tests' tiny model (random weights, ``--max-model-len 1024``), as the realengine tier does; with
it, it measures the engine given (``--model`` names the served model). ``inferwatch proxy``
runs as its own process in front of the engine, with one tenant and prices, reconciling
every 15 s as in production.

Direct and proxied blocks alternate for ``--rounds`` rounds, so that both see the same
machine load; each block sends ``--requests`` chat requests of ``--max-tokens`` tokens at
concurrency 1 and 8, non-streamed and streamed, each worker on its own keep-alive
connection. Reported per case: median latency (streams: also time to first token) and
throughput, direct and through the proxy, and the proxy's ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import proxy_overhead as common  # noqa: E402  (bench/ is on the path: this script's folder)

TENANT_KEY = "sk-bench-real"
PROMPT = "Say hello to the bench, and then tell it about the proxy in front of the engine."


async def _worker(
    client: httpx.AsyncClient, body: dict[str, Any], count: int, out: list[tuple[float, float]]
) -> None:
    for _ in range(count):
        start = time.perf_counter()
        first = 0.0
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                raise RuntimeError(f"HTTP {reply.status_code}: {(await reply.aread())[:200]!r}")
            async for _chunk in reply.aiter_bytes():
                first = first or time.perf_counter()
        end = time.perf_counter()
        out.append((first - start, end - start))


async def _block(url: str, key: str, body: dict[str, Any], concurrency: int, requests: int) -> Any:
    """Latencies (first byte, total) of one block, and its requests per second."""
    headers = {"authorization": f"Bearer {key}"}
    clients = [
        httpx.AsyncClient(base_url=url, headers=headers, timeout=300) for _ in range(concurrency)
    ]
    out: list[tuple[float, float]] = []
    try:
        for client in clients:  # open every connection before the clock starts
            await _worker(client, body, 1, [])
        start = time.perf_counter()
        per = max(1, requests // concurrency)
        await asyncio.gather(*(_worker(c, body, per, out) for c in clients))
        wall = time.perf_counter() - start
    finally:
        for client in clients:
            await client.aclose()
    return out, len(out) / wall


def _start_vllm(workdir: Path) -> tuple[Any, str]:
    from support import realengine, tinymodel

    model = tinymodel.write(workdir / "tiny-llama")
    print("starting vLLM on the tiny model (a minute or more) ...", flush=True)
    started = time.monotonic()
    engine = realengine.start_vllm(realengine.vllm_python(), model, workdir, ())
    print(f"vLLM serving after {time.monotonic() - started:.0f} s", flush=True)
    return engine, realengine.MODEL


def _start_proxy(engine_url: str, workdir: Path) -> tuple[Any, str]:
    digest = hashlib.sha256(TENANT_KEY.encode()).hexdigest()
    config = workdir / "proxy.yaml"
    config.write_text(
        f"upstream: {{url: '{engine_url}'}}\n"
        f"tenants: {{bench: {{key_sha256: ['{digest}']}}}}\n"
        "prices: {default: {prompt: 0.5, completion: 1.5}}\n"
    )
    process, port = common.start_proxy(config, TENANT_KEY, workdir / "proxy.log", 60)
    return process, f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=16, help="per block")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--engine-url", default="", help="a running engine (default: start one)")
    parser.add_argument("--model", default="tiny", help="the served model, with --engine-url")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="proxy-real-bench-"))
    engine = None
    if args.engine_url:
        engine_url, model = args.engine_url.rstrip("/"), args.model
    else:
        engine, model = _start_vllm(workdir)
        engine_url = engine.url
    proxy, proxy_url = _start_proxy(engine_url, workdir)
    version = httpx.get(engine_url + "/version", timeout=10).json().get("version", "?")
    cases = [(c, s) for s in (False, True) for c in (1, 8)]
    results: dict[tuple[str, int, bool], list[Any]] = {}
    try:
        for round_ in range(args.rounds):
            for concurrency, stream in cases:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": PROMPT}],
                    "max_tokens": args.max_tokens,
                    "stream": stream,
                }
                targets = [("direct", engine_url, "none"), ("proxy", proxy_url, TENANT_KEY)]
                for name, url, key in targets if round_ % 2 == 0 else targets[::-1]:
                    block = asyncio.run(_block(url, key, body, concurrency, args.requests))
                    results.setdefault((name, concurrency, stream), []).append(block)
            print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    finally:
        common._stop(proxy)
        if engine is not None:
            from support import realengine

            realengine.stop(engine)

    print(
        f"\nvLLM {version} (CPU build), model {model!r}, {os.cpu_count()} CPUs, "
        f"{args.rounds} rounds x {args.requests} requests, max_tokens {args.max_tokens}\n"
    )
    print(
        f"{'case':<18}{'direct p50':>12}{'proxy p50':>12}{'ratio':>8}"
        f"{'direct rps':>12}{'proxy rps':>11}{'ratio':>8}"
    )
    for concurrency, stream in cases:
        row = {}
        for name in ("direct", "proxy"):
            blocks = results[(name, concurrency, stream)]
            latencies = [total for block, _ in blocks for _, total in block]
            firsts = [first for block, _ in blocks for first, _ in block]
            row[name] = (
                statistics.median(latencies),
                statistics.median(firsts),
                statistics.median(rps for _, rps in blocks),
            )
        d, p = row["direct"], row["proxy"]
        label = f"c={concurrency} {'stream' if stream else 'json'}"
        print(
            f"{label:<18}{d[0] * 1000:>10.1f}ms{p[0] * 1000:>10.1f}ms{p[0] / d[0]:>8.3f}"
            f"{d[2]:>12.1f}{p[2]:>11.1f}{p[2] / d[2]:>8.3f}"
        )
        if stream:
            print(
                f"{'  first token':<18}{d[1] * 1000:>10.1f}ms{p[1] * 1000:>10.1f}ms"
                f"{p[1] / d[1]:>8.3f}"
            )


if __name__ == "__main__":
    main()
