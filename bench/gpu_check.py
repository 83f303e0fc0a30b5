"""Check the NVML collector against nvidia-smi on a real GPU, idle and under a matmul load.

    .venv/bin/python bench/gpu_check.py [--load-seconds 20] [--polls 200]

For each phase (idle, then bf16 8192^3 matmuls in a torch thread on every GPU) it polls the
collector and ``nvidia-smi --query-gpu`` back to back and compares, per GPU:

    utilisation      within 20 percentage points (both are sampled over different windows)
    memory used      within 256 MiB or 2 %; memory total within 1 MiB
    power            within 20 % or 30 W (NVML and nvidia-smi may average differently)
    temperature      within 3 degC
    SM clock         within 10 % or 60 MHz (power-cap clocks move quickly); memory clock 1 %

then times ``--polls`` steady-state polls (target: <= 0.5 ms per GPU). It prints one table and
exits 1 on any mismatch or a missed target, 2 when there is no NVIDIA driver or nvidia-smi.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TARGET_MS = 0.5
SMI_FIELDS = (
    "uuid",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "power.draw",
    "temperature.gpu",
    "clocks.sm",
    "clocks.mem",
)
MIB = 1024 * 1024


@dataclass(frozen=True)
class Check:
    label: str
    ours: Callable[[dict[str, float]], float]  # from our samples, in nvidia-smi's units
    smi: str
    within: Callable[[float, float], bool]
    tolerance: str


CHECKS = (
    Check(
        "utilization %",
        lambda s: s["util"] * 100,
        "utilization.gpu",
        lambda a, b: abs(a - b) <= 20,
        "+-20 pts",
    ),
    Check(
        "memory used MiB",
        lambda s: s["used"] / MIB,
        "memory.used",
        lambda a, b: abs(a - b) <= max(256, 0.02 * b),
        "256 MiB|2%",
    ),
    Check(
        "memory total MiB",
        lambda s: s["total"] / MIB,
        "memory.total",
        lambda a, b: abs(a - b) <= 1,
        "1 MiB",
    ),
    Check(
        "power W",
        lambda s: s["power"],
        "power.draw",
        lambda a, b: abs(a - b) <= max(30, 0.2 * b),
        "30 W|20%",
    ),
    Check(
        "temperature C", lambda s: s["temp"], "temperature.gpu", lambda a, b: abs(a - b) <= 3, "3 C"
    ),
    Check(
        "SM clock MHz",
        lambda s: s["sm"] / 1e6,
        "clocks.sm",
        lambda a, b: abs(a - b) <= max(60, 0.1 * b),
        "60 MHz|10%",
    ),
    Check(
        "memory clock MHz",
        lambda s: s["mem"] / 1e6,
        "clocks.mem",
        lambda a, b: abs(a - b) <= 0.01 * b + 1,
        "1%",
    ),
)


def ours(families: list[Any]) -> dict[str, dict[str, float]]:
    """Per GPU UUID, the readings the checks compare."""
    wanted = {
        "inferwatch_gpu_utilization_ratio": "util",
        "inferwatch_gpu_memory_used_bytes": "used",
        "inferwatch_gpu_memory_total_bytes": "total",
        "inferwatch_gpu_power_watts": "power",
    }
    readings: dict[str, dict[str, float]] = {}
    for family in families:
        for sample in family.samples:
            uuid = sample.labels.get("gpu_uuid")
            if not uuid:
                continue
            key = wanted.get(sample.name)
            if sample.name == "inferwatch_gpu_temperature_celsius":
                key = "temp" if sample.labels["sensor"] == "gpu" else None
            elif sample.name == "inferwatch_gpu_clock_hertz":
                key = "sm" if sample.labels["clock"] == "sm" else "mem"
            if key:
                readings.setdefault(uuid, {})[key] = sample.value
    return readings


def smi() -> dict[str, dict[str, float]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    rows = {}
    for line in out.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        rows[cells[0]] = {f: float(v) for f, v in zip(SMI_FIELDS[1:], cells[1:], strict=True)}
    return rows


def matmul_load(stop: threading.Event) -> None:
    import torch

    def burn(device: int) -> None:
        a = torch.randn(8192, 8192, device=f"cuda:{device}", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=f"cuda:{device}", dtype=torch.bfloat16)
        while not stop.is_set():
            for _ in range(20):
                a @ b
            torch.cuda.synchronize(device)

    threads = [
        threading.Thread(target=burn, args=(d,), daemon=True)
        for d in range(torch.cuda.device_count())
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def compare(phase: str, collector: Any) -> list[tuple[str, str, float, float, str, bool]]:
    import asyncio

    mine = ours(asyncio.run(collector.collect()))
    theirs = smi()
    results = []
    for uuid, reference in sorted(theirs.items()):
        reading = mine.get(uuid)
        for check in CHECKS:
            if reading is None:
                results.append(
                    (
                        phase,
                        f"{uuid[:12]} {check.label}",
                        float("nan"),
                        reference[check.smi],
                        "GPU missing",
                        False,
                    )
                )
                continue
            value = check.ours(reading)
            ok = check.within(value, reference[check.smi])
            results.append(
                (
                    phase,
                    f"{uuid[:12]} {check.label}",
                    value,
                    reference[check.smi],
                    check.tolerance,
                    ok,
                )
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument("--polls", type=int, default=200)
    args = parser.parse_args()

    import pynvml  # type: ignore[import-untyped]

    from inferwatch.exporters.gpu.nvml import NvmlTelemetry

    if not shutil.which("nvidia-smi"):
        print("gpu_check: nvidia-smi not found", file=sys.stderr)
        return 2
    collector = NvmlTelemetry(pynvml, watch_xids=True)
    try:
        collector.start()
    except Exception as error:
        print(f"gpu_check: NVML unavailable: {error}", file=sys.stderr)
        return 2
    results = compare("idle", collector)

    stop = threading.Event()
    load = threading.Thread(target=matmul_load, args=(stop,), daemon=True)
    load.start()
    time.sleep(min(8.0, args.load_seconds / 2))  # clocks, power and temperature settle
    results += compare("load", collector)
    stop.set()
    load.join(timeout=30)

    gpus = len(collector.devices)
    collector.poll()
    polls = []
    for _ in range(args.polls):
        started = time.perf_counter()
        collector.poll()
        polls.append(time.perf_counter() - started)
    collector.close()
    poll_ms = statistics.median(polls) * 1e3 / gpus

    print(f"{'phase':6} {'check':34} {'inferwatch':>12} {'nvidia-smi':>12} {'tolerance':>11}  ok")
    for phase, label, value, reference, tolerance, ok in results:
        print(
            f"{phase:6} {label:34} {value:12.1f} {reference:12.1f} {tolerance:>11}  "
            f"{'ok' if ok else 'MISMATCH'}"
        )
    cost_ok = poll_ms <= TARGET_MS
    print(
        f"\nsteady-state poll: {poll_ms:.3f} ms per GPU over {gpus} GPU(s) "
        f"(target <= {TARGET_MS} ms): {'ok' if cost_ok else 'MISSED'}"
    )
    return 0 if cost_ok and all(r[-1] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
