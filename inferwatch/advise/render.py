"""The advice for a person (a table) and for automation (JSON)."""

from __future__ import annotations

from typing import Any

from inferwatch.advise.plan import Objectives, Plan
from inferwatch.advise.proposals import Proposal
from inferwatch.advise.window import Window


def _value(value: float | None) -> str:
    if value is None:
        return "no sample"
    return f"{value:,.0f}" if value == int(value) and abs(value) >= 10 else f"{value:.4g}"


def _shown(proposal: Proposal) -> str:
    value = f"{proposal.value:g}"
    if proposal.setting == "replicas":
        return f"replicas {value}"
    if proposal.flag is None:
        return f"{proposal.setting} {value} (no flag known for this engine)"
    return f"{proposal.flag} {value}"


def table(window: Window, plan: Plan, slo: Objectives, made: list[Proposal]) -> str:
    load = plan.workload
    gpu, tp = plan.capacity.gpu.name, plan.capacity.serving.tensor_parallel
    objectives = f"TTFT <= {slo.ttft:g} s" + (
        "" if slo.tpot is None else f", TPOT <= {slo.tpot:g} s"
    )
    lines = [
        f"model     {window.model} ({window.engine or 'engine unknown'} on {gpu} x{tp})",
        f"window    {window.seconds:g} s: {window.requests:,} requests ({window.rate:.3g}/s), "
        f"{load.prompt_tokens:,} prompt + {load.completion_tokens:,} completion tokens each",
        f"SLO       {objectives}",
        f"advice    {plan.estimate.replicas} replica(s), {plan.gpus} GPU(s): "
        + " ".join(_shown(p) for p in made if p.setting != "replicas" and p.flag),
        "",
    ]
    for proposal in made:
        lines.append(_shown(proposal))
        if proposal.finding:
            lines.append(f"  why     {proposal.finding}")
        for item in proposal.evidence:
            lines.append(f"  read    {item.signal} = {_value(item.value)}  ({item.series})")
        lines.append(f"  effect  {proposal.effect}")
    missing = missing_lines(window)
    if missing:
        lines += ["", *missing]
    return "\n".join(lines)


def missing_lines(window: Window) -> list[str]:
    engine = window.engine or "the engine"
    return [
        f"missing   {signal}: {engine} does not export {window.readings[signal].series}"
        for signal in window.unexported
    ]


def document(window: Window, plan: Plan, slo: Objectives, made: list[Proposal]) -> dict[str, Any]:
    return {
        "model": window.model,
        "engine": window.engine or None,
        "gpu": plan.capacity.gpu.name,
        "tensor_parallel": plan.capacity.serving.tensor_parallel,
        "window_seconds": window.seconds,
        "requests": window.requests,
        "rate": window.rate,
        "prompt_tokens": plan.workload.prompt_tokens,
        "completion_tokens": plan.workload.completion_tokens,
        "slo": {"ttft_seconds": slo.ttft, "tpot_seconds": slo.tpot},
        "replicas": plan.estimate.replicas,
        "gpus": plan.gpus,
        "expected": {
            "ttft_seconds": plan.estimate.ttft,
            "tpot_seconds": plan.estimate.tpot,
            "running": plan.estimate.running,
        },
        "findings": plan.findings,
        "proposals": [
            {
                "setting": p.setting,
                "flag": p.flag,
                "value": p.value,
                "finding": p.finding,
                "effect": p.effect,
                "evidence": [
                    {"signal": e.signal, "series": e.series, "query": e.expr, "value": e.value}
                    for e in p.evidence
                ],
            }
            for p in made
        ],
        "missing": [
            {"signal": signal, "series": window.readings[signal].series}
            for signal in window.unexported
        ],
    }
