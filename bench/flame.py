"""Flame graphs of the hot paths under their benchmarks' load, recorded by py-spy.

    .venv/bin/python bench/flame.py [--seconds 10] [--out bench/flames] [--only NAME ...]

Needs py-spy (the ``bench`` extra: ``pip install -e '.[bench]'``) and the right to trace
another process (root, or ``kernel.yama.ptrace_scope=0``). Each graph is a real process under
the load of the benchmark that times it:

- ``sidecar-dp4``: ``inferwatch sidecar`` in front of ``scrape_path.py``'s data-parallel page
  (4 engine ranks), scraped back to back;
- ``proxy-local-c16``: ``inferwatch proxy`` with a tenant budget in its own memory, at
  concurrency 16 against ``proxy_overhead.py``'s mock engine;
- ``proxy-redis-c16``: the same with the budget and rate limits in Redis (``shared_state``,
  ``proxy_shared_state.py``'s setup).

Each is written as ``NAME.svg``: open it in a browser, hover a frame for its share of the
samples, click one to zoom.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from proxy_overhead import TENANT_KEY, _run_load, _serve_in_child, _serve_mock, _stop, start_proxy
from proxy_shared_state import _config
from scrape_path import VLLM_PAGE, data_parallel_page, engine_serving, sidecar_serving

from support.redis import RedisServer  # proxy_overhead put tests/ on the path

REPO = Path(__file__).resolve().parent.parent
RATE_HZ = 250


def _py_spy() -> str:
    found = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    return found


def record(pid: int, out: Path, seconds: int, load: Callable[[], object]) -> None:
    """Record ``pid`` for ``seconds`` into the flame graph ``out`` while ``load`` runs."""
    spy = subprocess.Popen(
        [_py_spy(), "record", "--pid", str(pid), "--rate", str(RATE_HZ),
         "--duration", str(seconds), "--format", "flamegraph", "--output", str(out),
         "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert spy.stderr is not None
    while spy.poll() is None:
        load()
    if spy.returncode != 0:
        raise SystemExit(f"py-spy failed on {out.name}: {spy.stderr.read().decode()[-400:]}")
    print(f"  {out}", flush=True)


def sidecar(out: Path, seconds: int) -> None:
    page = data_parallel_page(VLLM_PAGE.read_text(), 4)
    with (
        engine_serving(page) as engine_url,
        sidecar_serving(engine_url) as (url, pid),
        httpx.Client() as client,
    ):
        for _ in range(5):  # warm: detection, memos
            client.get(url).raise_for_status()
        record(pid, out, seconds, lambda: client.get(url).raise_for_status())


@contextmanager
def proxy(shared: bool, workdir: Path) -> Iterator[tuple[int, int]]:
    """A proxy in front of the mock engine (budget in Redis with ``shared``): (pid, port)."""
    mock, mock_port = _serve_in_child(_serve_mock, 0.0)
    redis = RedisServer(workdir / "redis", fsync="everysec") if shared else None
    state = {"url": redis.address, "journal_dir": str(workdir)} if redis else None
    name = "redis" if shared else "local"
    process = None
    try:
        config = _config(workdir, name, mock_port, state, rate_limits=shared)
        process, port = start_proxy(config, TENANT_KEY, workdir / f"{name}.log", 30)
        _run_load(port, TENANT_KEY, False, 16, 500)  # warm
        yield process.pid, port
    finally:
        if process is not None:
            _stop(process)
        if redis is not None:
            redis.stop()
        mock.terminate()
        mock.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="seconds recorded per graph")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "flames", help="folder")
    parser.add_argument("--only", action="append", default=[], help="a graph's name (repeatable)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = ["sidecar-dp4", "proxy-local-c16", "proxy-redis-c16"]
    unknown = set(args.only) - set(names)
    if unknown:
        raise SystemExit(f"unknown graph {sorted(unknown)}; one of {names}")
    for name in args.only or names:
        out = args.out / f"{name}.svg"
        if name == "sidecar-dp4":
            sidecar(out, args.seconds)
            continue
        workdir = Path(tempfile.mkdtemp(prefix="flame-"))
        try:
            with proxy(name == "proxy-redis-c16", workdir) as (pid, port):
                started = time.monotonic()
                record(pid, out, args.seconds, lambda: _run_load(port, TENANT_KEY, False, 16, 500))
                print(f"    {time.monotonic() - started:.0f} s", flush=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
