"""One evaluation of a model's advice: read its window, refuse or plan, propose.

The one path both ``inferwatch advise`` (once, then exit) and ``inferwatch advisor`` (every
``--every``, served as series) take, so that the rules have one implementation. A refusal
names its outcome, the value of ``inferwatch_advise_runs_total``'s ``outcome`` label.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.advise import plan as planning
from inferwatch.advise import rules
from inferwatch.advise.proposals import Proposal, proposals
from inferwatch.advise.window import REQUIRED, Window, read
from inferwatch.canary.prometheus import Prometheus, PrometheusError
from inferwatch.capacity import planner as cap
from inferwatch.config import Duration
from inferwatch.mixin import config as alert_config

#: the outcomes of an evaluation, the first the one that gives advice
OUTCOMES = (
    "advised",
    "too_little_traffic",
    "missing_signal",
    "no_setting_meets",
    "bad_input",
    "prometheus_error",
)


class Refused(Exception):
    """No advice; ``outcome`` says which of ``OUTCOMES`` and the message why, in one line."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True)
class Request:
    """What to advise: the model label, the capacity model's preset or config.json of its
    weights (None: the model label), the GPU preset (None: the one the replicas report)."""

    model: str
    engine_model: str | None
    gpu: str | None
    tensor_parallel: int
    slo: planning.Objectives
    window: Duration
    min_requests: int = rules.MIN_REQUESTS
    headroom: float = planning.HEADROOM


@dataclass(frozen=True)
class Advice:
    window: Window
    plan: planning.Plan
    proposals: list[Proposal]


def objectives(ttft: float | None, tpot: float | None) -> planning.Objectives:
    """The SLO to meet; the TTFT one defaults to the alert config's threshold."""
    if ttft is None:
        ttft = float(alert_config.defaults()["slo"]["ttft"]["threshold"])
    return planning.Objectives(ttft, tpot)


def gpu_of(window: Window, name: str | None) -> cap.GPUSpec:
    """The GPU preset given, else the one whose product name the replicas report."""
    try:
        if name is not None:
            return cap.gpu_preset(name)
    except cap.CapacityError as exc:
        raise Refused("bad_input", str(exc)) from None
    for spec in cap.GPU_PRESETS.values():
        if window.gpu_name and window.gpu_name == spec.model_name:
            return spec
    seen = f"they report {window.gpu_name!r}" if window.gpu_name else "they report none"
    raise Refused(
        "bad_input", f"no GPU preset matches the GPUs of {window.model} ({seen}): give --gpu"
    )


def evaluate(prometheus: Prometheus, request: Request, at: float) -> Advice:
    """The advice for ``request`` from the window that ends at ``at`` (unix seconds);
    raises Refused."""
    try:
        with prometheus:
            seen = read(prometheus, request.model, request.window, at)
    except PrometheusError as exc:
        raise Refused("prometheus_error", str(exc)) from None
    refused = rules.refusal(seen, request.min_requests)
    if refused is not None:
        unexported = any(signal in seen.unexported for signal in REQUIRED)
        few = not unexported and seen.requests < request.min_requests
        raise Refused("too_little_traffic" if few else "missing_signal", f"no advice: {refused}")
    try:
        spec = cap.model_preset(request.engine_model or request.model)
    except cap.CapacityError as exc:
        raise Refused("bad_input", f"{exc} (--engine-model)") from None
    gpu = gpu_of(seen, request.gpu)
    try:
        chosen = planning.plan(
            seen, spec, gpu, request.tensor_parallel, request.slo, request.headroom
        )
    except planning.Unmeetable as exc:
        raise Refused("no_setting_meets", f"no setting meets the SLO: {exc}") from None
    except cap.CapacityError as exc:
        raise Refused("bad_input", str(exc)) from None
    return Advice(seen, chosen, proposals(seen, chosen))
