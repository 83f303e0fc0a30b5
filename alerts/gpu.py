"""GPU and resource layer: hardware faults, thermals, KV-cache pressure, waste, telemetry.

GPU series carry ``gpu_uuid`` and the scrape target's labels; alerts keep those labels as
they are (no aggregation), so an isolation action finds the GPU and its replica. XIDs are
counted over a window by the action NVIDIA's catalogue recommends, never read from the
sticky last-XID gauge. ``gpu_healthy`` and ``gpu_backend_up`` are read with any ``reason``
label summed away, so a change of reason never restarts a ``for:`` timer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.mixin import promql, recording
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Alert, Panel
from inferwatch.mixin.promql import metric, one_of

GPU = "gpu"
#: each alert's defaults (alerts.<name> in the config, where a user's file overrides them):
#: ``for`` and its own thresholds
SETTINGS: Mapping[str, Mapping[str, Any]] = {
    "InferwatchGPUXidErrors": {
        "for": "0s",
        "window": "10m",
        "critical_actions": ["reset_gpu", "reboot_node"],
        "warning_actions": [
            "restart_app",
            "check_app",
            "check_hardware",
            "contact_support",
            "unknown",
        ],
    },
    "InferwatchGPUEccUncorrectable": {"for": "0s", "window": "10m"},
    "InferwatchGPURowRemapFailure": {"for": "0s"},
    "InferwatchGPURowRemapPending": {"for": "15m"},
    # link-level retries and errors counted over `window`, at least `min_errors` of them: a
    # degrading PCIe slot or riser, an NVLink lane or NVSwitch port going bad
    "InferwatchGPUPCIeReplays": {"for": "0s", "window": "10m", "min_errors": 100},
    "InferwatchGPUNVLinkErrors": {"for": "0s", "window": "10m", "min_errors": 10},
    "InferwatchGPUUnhealthy": {"for": "0s"},
    "InferwatchGPUTemperatureNearSlowdown": {"for": "5m", "margin": 5.0},
    "InferwatchGPUClocksThrottled": {
        "for": "15m",
        "warning_reasons": ["hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake"],
        "info_reasons": ["power_cap"],
    },
    "InferwatchKVCacheSaturated": {"for": "5m", "usage": 0.9, "min_waiting": 1.0},
    # preempted requests per finished request
    "InferwatchPreemptionStorm": {"for": "5m", "ratio": 0.1},
    # a model's output tokens per second (all its replicas) below the floor while at least
    # `min_waiting` requests queue for it: demand is there, the fleet delivers too little
    "InferwatchThroughputBelowFloor": {"for": "10m", "tokens_per_second": 10, "min_waiting": 1.0},
    # `gpu_hour_price`: what one GPU-hour costs (the currency of the proxy's prices), for the
    # cost board's busy and idle GPU cost; the default is a placeholder, set your own
    "InferwatchGPUIdleWaste": {
        "for": "30m",
        "window": "1h",
        "utilization": 0.1,
        "gpu_hour_price": 2.5,
    },
    "InferwatchGPUTelemetryDown": {"for": "5m"},
}


def grew(selector: str, window: str) -> str:
    """How much a counter grew over ``window``, counting a series born inside the window
    from zero (an XID counter appears at 1 with its first error, which ``increase`` misses)."""
    return f"({selector} - ({selector} offset {window} or {selector} * 0))"


def alerts(config: Config) -> list[Alert]:
    return [
        *_xid(config),
        *_memory(config),
        *_interconnect(config),
        *_health(config),
        *_thermal(config),
        *_saturation(config),
        *_waste(config),
    ]


def _xid(config: Config) -> list[Alert]:
    settings = config.alert("InferwatchGPUXidErrors")
    window = settings.text("window")
    result = []
    for severity in ("critical", "warning"):
        actions = settings.names(f"{severity}_actions")
        if not actions:
            continue
        xids = metric(config, "gpu_xid_errors", f'action=~"{one_of(actions)}"')
        result.append(
            Alert(
                name="InferwatchGPUXidErrors",
                severity=severity,
                expr=f"{grew(xids, window)} > 0",
                for_=settings.for_,
                summary="A GPU reported XID errors that call for action.",
                description=(
                    "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} reported XID "
                    "{{ $labels.xid }} {{ $value | humanize }} time(s) in the last "
                    f"{window}; NVIDIA's catalogue says: {{{{ $labels.action }}}}."
                ),
                panel=Panel(GPU, 1),
            )
        )
    return result


def _interconnect(config: Config) -> list[Alert]:
    pcie = config.alert("InferwatchGPUPCIeReplays")
    nvlink = config.alert("InferwatchGPUNVLinkErrors")
    pcie_window, nvlink_window = pcie.text("window"), nvlink.text("window")
    replays = metric(config, "gpu_pcie_replays")
    errors = metric(config, "gpu_nvlink_errors")
    return [
        Alert(
            name="InferwatchGPUPCIeReplays",
            severity="warning",
            expr=f"{grew(replays, pcie_window)} >= {promql.number(pcie.number('min_errors'))}",
            for_=pcie.for_,
            summary="A GPU's PCIe link keeps retrying transfers.",
            description=(
                "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} counted "
                f"{{{{ $value | humanize }}}} PCIe replays in {pcie_window}: the link to the host "
                "is degrading (slot, riser, cable); transfers slow down and may fail with XID 79."
            ),
            panel=Panel(GPU, 20),
        ),
        Alert(
            name="InferwatchGPUNVLinkErrors",
            severity="warning",
            expr=(
                f"sum without (link) {grew(errors, nvlink_window)} >= "
                f"{promql.number(nvlink.number('min_errors'))}"
            ),
            for_=nvlink.for_,
            summary="A GPU's NVLink counts errors.",
            description=(
                "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} counted "
                f"{{{{ $value | humanize }}}} NVLink {{{{ $labels.error }}}} errors in "
                f"{nvlink_window}: a lane or NVSwitch port is going bad; tensor-parallel "
                "collectives slow down or hang."
            ),
            panel=Panel(GPU, 20),
        ),
    ]


def _memory(config: Config) -> list[Alert]:
    ecc = config.alert("InferwatchGPUEccUncorrectable")
    window = ecc.text("window")
    uncorrected = metric(config, "gpu_ecc_errors", 'error="uncorrected"')
    failed = config.alert("InferwatchGPURowRemapFailure")
    pending = config.alert("InferwatchGPURowRemapPending")
    return [
        Alert(
            name="InferwatchGPUEccUncorrectable",
            severity="critical",
            expr=f"max without (scope) {grew(uncorrected, window)} > 0",
            for_=ecc.for_,
            summary="A GPU had uncorrectable ECC memory errors.",
            description=(
                "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} counted "
                f"{{{{ $value | humanize }}}} uncorrectable ECC error(s) in {window}: data in "
                "its memory may be corrupt; the GPU needs a reset."
            ),
            panel=Panel(GPU, 2),
        ),
        Alert(
            name="InferwatchGPURowRemapFailure",
            severity="critical",
            expr=f"{metric(config, 'gpu_row_remap_failed')} == 1",
            for_=failed.for_,
            summary="A GPU failed to remap a bad memory row.",
            description=(
                "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} ran out of spare rows "
                "or failed a row remap: take it out of service and start an RMA."
            ),
            panel=Panel(GPU, 3),
        ),
        Alert(
            name="InferwatchGPURowRemapPending",
            severity="warning",
            expr=f"{metric(config, 'gpu_row_remap_pending')} == 1",
            for_=pending.for_,
            summary="A GPU has a memory row remap waiting for a reset.",
            description=(
                "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} has had a row remap "
                f"pending for {pending.for_}; it takes effect at the next GPU reset."
            ),
            panel=Panel(GPU, 3),
        ),
    ]


def _health(config: Config) -> list[Alert]:
    unhealthy = config.alert("InferwatchGPUUnhealthy")
    telemetry = config.alert("InferwatchGPUTelemetryDown")
    # backend="none" is a replica without GPUs (CPU-only): nothing to read is no outage
    telemetry_up = metric(config, "gpu_backend_up", 'backend!="none"')
    return [
        Alert(
            name="InferwatchGPUUnhealthy",
            severity="critical",
            expr=f"min without (reason) ({metric(config, 'gpu_healthy')}) == 0",
            for_=unhealthy.for_,
            summary="A GPU is lost or needs a reset.",
            description=(
                "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} is unhealthy (an XID "
                "that needs a reset or reboot, uncorrectable ECC, a failed row remap, or "
                "the GPU is lost); its replica fails /readyz."
            ),
            panel=Panel(GPU, 4),
        ),
        Alert(
            name="InferwatchGPUTelemetryDown",
            severity="warning",
            expr=f"min without (reason) ({telemetry_up}) == 0",
            for_=telemetry.for_,
            summary="A sidecar cannot read GPU telemetry.",
            description=(
                "The {{ $labels.backend }} GPU backend of {{ $labels.instance }} has not "
                f"answered for {telemetry.for_}: GPU faults on that replica go unseen."
            ),
            panel=Panel(GPU, 5),
        ),
    ]


def _thermal(config: Config) -> list[Alert]:
    hot = config.alert("InferwatchGPUTemperatureNearSlowdown")
    margin = promql.number(hot.number("margin"))
    temperature = metric(config, "gpu_temperature", 'sensor="gpu"')
    slowdown = metric(config, "gpu_temperature_threshold", 'threshold="slowdown"')
    throttled = config.alert("InferwatchGPUClocksThrottled")
    result = [
        Alert(
            name="InferwatchGPUTemperatureNearSlowdown",
            severity="warning",
            expr=f"{temperature}\n>= ignoring (sensor, threshold) ({slowdown} - {margin})",
            for_=hot.for_,
            summary="A GPU runs close to its own thermal slowdown threshold.",
            description=(
                "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} is at "
                f"{{{{ $value }}}} °C, within {margin} °C of the temperature at which it "
                "slows its clocks."
            ),
            panel=Panel(GPU, 6),
        )
    ]
    for severity in ("warning", "info"):
        reasons = throttled.names(f"{severity}_reasons")
        if not reasons:
            continue
        events = metric(config, "gpu_clock_event", f'reason=~"{one_of(reasons)}"')
        result.append(
            Alert(
                name="InferwatchGPUClocksThrottled",
                severity=severity,
                expr=f"{events} == 1",
                for_=throttled.for_,
                summary="A GPU's clocks are held down by power or thermal limits.",
                description=(
                    "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} has had its clocks "
                    f"held down by {{{{ $labels.reason }}}} for {throttled.for_}: it serves "
                    "slower than it can."
                ),
                panel=Panel(GPU, 7),
            )
        )
    return result


def _saturation(config: Config) -> list[Alert]:
    kv = config.alert("InferwatchKVCacheSaturated")
    storm = config.alert("InferwatchPreemptionStorm")
    floor = config.alert("InferwatchThroughputBelowFloor")
    model = promql.by(config, ("model",))
    window = config.rate_window
    # the recording of output tokens per second per model version (recording._rate_group)
    generated = recording.catalog_name("engine_generation_tokens").removesuffix("_total")
    output = f"model_version:{generated}:rate{window}"
    usage = metric(config, "engine_kv_cache_usage")
    queue = metric(config, "engine_requests_waiting")
    preemptions = metric(config, "engine_preemptions")
    requests = recording.requests(config, "pod")
    return [
        Alert(
            name="InferwatchKVCacheSaturated",
            severity="warning",
            expr=(
                f"avg_over_time({usage}[{window}]) >= {promql.number(kv.number('usage'))}\n"
                f"and avg_over_time({queue}[{window}]) >= "
                f"{promql.number(kv.number('min_waiting'))}"
            ),
            for_=kv.for_,
            summary="A replica's KV cache is full while requests queue.",
            description=(
                "The KV cache of pod {{ $labels.pod }} ({{ $labels.model }} "
                "{{ $labels.model_version }}) averaged {{ $value | humanizePercentage }} over "
                f"{window} with requests waiting: expect preemptions, TTFT growth and OOM risk."
            ),
            panel=Panel(GPU, 8),
        ),
        Alert(
            name="InferwatchPreemptionStorm",
            severity="warning",
            expr=(
                f"sum without (reason) (rate({preemptions}[{window}]))\n"
                f"/ {requests}\n> {promql.number(storm.number('ratio'))}"
            ),
            for_=storm.for_,
            summary="A replica keeps preempting running requests to free KV cache.",
            description=(
                "Pod {{ $labels.pod }} ({{ $labels.model }} {{ $labels.model_version }}) "
                'preempted {{ printf "%.2f" $value }} requests per finished request over '
                f"{window}: requests are recomputed and latency climbs."
            ),
            panel=Panel(GPU, 9),
        ),
        Alert(
            name="InferwatchThroughputBelowFloor",
            severity="warning",
            expr=(
                f"sum {model} ({output})\n"
                f"< {promql.number(floor.number('tokens_per_second'))}\n"
                f"and sum {model} (avg_over_time({queue}[{window}])) >= "
                f"{promql.number(floor.number('min_waiting'))}"
            ),
            for_=floor.for_,
            summary="A model generates fewer tokens per second than its floor while requests wait.",
            description=(
                "{{ $labels.model }} generated {{ $value | humanize }} output tokens per second "
                f"over {window} across its replicas, under the floor of "
                f"{promql.number(floor.number('tokens_per_second'))}, with requests waiting: the "
                "fleet is short of capacity or its GPUs are slow (clocks, PCIe, NVLink)."
            ),
            panel=Panel("fleet", 19),
        ),
    ]


def _waste(config: Config) -> list[Alert]:
    idle = config.alert("InferwatchGPUIdleWaste")
    window = idle.text("window")
    utilization = metric(config, "gpu_utilization")
    queue = metric(config, "engine_requests_waiting")
    return [
        Alert(
            name="InferwatchGPUIdleWaste",
            severity="info",
            expr=(
                f"avg_over_time({utilization}[{window}]) < "
                f"{promql.number(idle.number('utilization'))}\n"
                f"and {promql.on(config, ['instance'])} max {promql.by(config, ['instance'])} "
                f"(max_over_time({queue}[{window}])) == 0"
            ),
            for_=idle.for_,
            summary="A serving GPU sits nearly idle.",
            description=(
                "GPU {{ $labels.gpu_uuid }} on {{ $labels.instance }} averaged "
                f"{{{{ $value | humanizePercentage }}}} utilization over {window} with an "
                "empty queue: the replica could be scaled in or share its GPU."
            ),
            panel=Panel(GPU, 10),
        )
    ]
