"""GPU health: faults first (XID, ECC, row remapping, health), then heat, power, clocks, use.

Panels 1-10 are the ones the GPU and saturation alerts link to (their ``dashboard_url``).
Every series is joined to the replica that uses the GPU (``Ctx.on_replica``), so the model
and replica variables narrow GPU series too.
"""

from __future__ import annotations

from inferwatch.capacity.planner import GPU_PRESETS
from inferwatch.dashboards.panels import ORANGE, Board, Ctx, Panel, Q, Scope, Steps, above, below
from inferwatch.mixin import promql, recording

E, C = Scope.ENGINE, Scope.CLUSTER
GPU = "{{pod}} {{gpu_uuid}}"


def board(ctx: Ctx) -> Board:
    config = ctx.config
    c = config.cluster_label
    j = ctx.on_replica
    xid = config.alert("InferwatchGPUXidErrors")
    ecc_window = config.alert("InferwatchGPUEccUncorrectable").text("window")
    margin = config.alert("InferwatchGPUTemperatureNearSlowdown").number("margin")
    kv = config.alert("InferwatchKVCacheSaturated")
    preempt = config.alert("InferwatchPreemptionStorm").number("ratio")
    idle = config.alert("InferwatchGPUIdleWaste").number("utilization")
    window = xid.text("window")
    throttle = ", ".join(config.alert("InferwatchGPUClocksThrottled").names("warning_reasons"))
    by_gpu = f"{c}, pod, gpu_uuid"
    xids = j(ctx.new_in(ctx.m("gpu_xid_errors", C), window))
    ecc = j(ctx.new_in(ctx.m("gpu_ecc_errors", C), ecc_window))
    pcie, nvlink = (config.alert(f"InferwatchGPU{n}") for n in ("PCIeReplays", "NVLinkErrors"))
    replays = j(ctx.new_in(ctx.m("gpu_pcie_replays", C), pcie.text("window")))
    link_errors = j(ctx.new_in(ctx.m("gpu_nvlink_errors", C), nvlink.text("window")))
    link_lines = sorted({pcie.number("min_errors"), nvlink.number("min_errors")})
    slowdown = ctx.m("gpu_temperature_threshold", C, 'threshold="slowdown"')
    power = j(f"rate({ctx.m('gpu_energy', C)}[$__rate_interval])")
    return Board(
        "gpu", "Inferwatch / GPU health",
        "Hardware faults (XID by action, ECC, row remapping), health and readiness, then "
        "temperature against the slowdown threshold, power against the limit, clock event "
        "reasons, utilization and memory, per replica GPU.",
    ).row(
        "Faults",
        Panel(1, f"XID errors by action ({window})", "XIDs each GPU reported in the last "
              f"{window}, by the action NVIDIA's catalogue prescribes. "
              f"{', '.join(xid.names('critical_actions'))} pages: drain the node and repair "
              "the GPU; restart_app: restart the engine; ignore: nothing to do. Empty until "
              f"a GPU reports an XID: a healthy GPU has none in the last {window}.", "short",
              [Q(f"sum by ({by_gpu}, xid, action) ({xids})",
                 "{{pod}} XID {{xid}} {{action}}")],
              thresholds=above(None, 1)),
        Panel(2, f"ECC errors ({ecc_window})", "Corrected and uncorrected ECC errors in the "
              f"last {ecc_window}. Any uncorrected error pages (InferwatchGPUEccUncorrectable): "
              "the GPU's memory returned bad data; drain it and reset the GPU.", "short",
              [Q(f"sum by ({by_gpu}, error) ({ecc})",
                 "{{pod}} {{error}}")],
              thresholds=above(None, 1)),
        Panel(3, "Row remapping", "Rows remapped after memory errors, and the pending and "
              "failed flags. Pending: a GPU reset applies the remap (warning); failed: the "
              "GPU is out of spare rows and must be replaced (pages).", "short",
              [Q(j(ctx.m("gpu_row_remap_pending", C)), "pending " + GPU),
               Q(j(ctx.m("gpu_row_remap_failed", C)), "failed " + GPU),
               Q(f"sum by ({by_gpu}, error) ({j(ctx.m('gpu_remapped_rows', C))})",
                 "remapped {{error}} " + GPU)],
              thresholds=above(None, 1)),
        Panel(20, "PCIe replays and NVLink errors", f"PCIe link retries in the last "
              f"{pcie.text('window')} and NVLink errors by kind in the last "
              f"{nvlink.text('window')}, per GPU. {pcie.number('min_errors'):g} replays is "
              "InferwatchGPUPCIeReplays (the slot, riser or cable degrades), "
              f"{nvlink.number('min_errors'):g} NVLink errors InferwatchGPUNVLinkErrors (a lane "
              "or NVSwitch port): both slow transfers before they fail; plan to drain the node. "
              "A PCIe board without NVLink (L40S, L4) has no NVLink line.",
              "short",
              [Q(f"sum by ({by_gpu}) ({replays})", "PCIe replays " + GPU),
               Q(f"sum by ({by_gpu}, error) ({link_errors})", "NVLink {{error}} " + GPU)],
              thresholds=Steps(steps=tuple((v, ORANGE) for v in link_lines))),
        Panel(4, "GPU healthy", "1 while nothing the sidecar watches (XID, ECC, lost GPU) "
              "has marked the GPU unhealthy; 0 pages (InferwatchGPUUnhealthy) and fails the "
              "replica's gpu readiness condition.", "bool_yes_no",
              [Q(j(f"min without (reason) ({ctx.m('gpu_healthy', C)})"), GPU)],
              thresholds=below(1), kind="state", states=("unhealthy", "healthy")),
        Panel(5, "GPU telemetry backend up", "1 while the sidecar reads its GPUs (NVML or "
              "dcgm-exporter). At 0 every GPU panel of the replica is blind "
              "(InferwatchGPUTelemetryDown): check the driver or dcgm-exporter.", "bool_yes_no",
              [Q(j(f"min without (reason) ({ctx.m('gpu_backend_up', C)})"), "{{pod}}")],
              thresholds=below(1)),
        Panel(13, "Readiness and isolation", "The replica's /readyz conditions: gpu at 0 "
              "means routers already skip it; an isolation condition at 0 means automation "
              "took it out on purpose.", "bool_yes_no",
              [Q(f"min by ({c}, pod, condition) ({ctx.m('replica_ready', E)})",
                 "{{pod}} {{condition}}")],
              thresholds=below(1), kind="state", states=("not ready", "ready")),
    ).row(
        "Heat, power, clocks",
        Panel(6, "Temperature against the slowdown threshold", "GPU temperature, and the "
              f"alert line: the GPU's own slowdown threshold minus {margin:g} C "
              "(InferwatchGPUTemperatureNearSlowdown; the threshold from NVML, or dcgm-exporter "
              "with the DCGM_FI_DEV_SLOWDOWN_TEMP field). Past it the GPU cuts clocks: check "
              "cooling and airflow.", "celsius",
              [Q(j(ctx.m("gpu_temperature", C, 'sensor="gpu"')), GPU),
               Q(j(f"{slowdown} - {margin:g}"), "alert line " + GPU)]),
        Panel(7, "Clocks and clock event reasons", "SM clock, and each active clock event "
              "reason (1 active; NVML or a dcgm-exporter with the clock-events field). "
              f"{throttle} warn: the GPU is throttling, tokens slow down. No reason line while "
              "the GPU runs at full clocks (busy below its power limit); gpu_idle when nothing "
              "runs, power_cap at the limit.", "hertz",
              [Q(j(ctx.m("gpu_clock", C, 'clock="sm"')), "SM " + GPU),
               Q(j(f"{ctx.m('gpu_clock_event', C)} == 1"), "{{reason}} " + GPU)]),
        Panel(12, "Power against its limit", "Power draw and the enforced limit (from NVML, "
              "or dcgm-exporter with the DCGM_FI_DEV_ENFORCED_POWER_LIMIT field). Draw pinned "
              "at the limit with power_cap events is the GPU running as fast as its power "
              "budget allows.", "watt",
              [Q(j(ctx.m("gpu_power", C)), GPU),
               Q(j(ctx.m("gpu_power_limit", C)), "limit " + GPU)]),
    ).row(
        "Use",
        Panel(10, "GPU utilization", "Share of time a kernel ran. Below "
              f"{idle:g} for an hour with nothing queued is InferwatchGPUIdleWaste: scale "
              "the replica in.", "percentunit",
              [Q(j(ctx.m("gpu_utilization", C)), GPU)], thresholds=below(idle), max=1),
        Panel(11, "Memory used / reserved / total", "Framebuffer memory in use, reserved "
              "by the driver, and installed. Engines preallocate the KV cache, so used near "
              "total is normal; a change is not.", "bytes",
              [Q(f"sum by ({by_gpu}) ({j(ctx.m('gpu_memory_used', C))})", "used " + GPU),
               Q(f"sum by ({by_gpu}) ({j(ctx.m('gpu_memory_reserved', C))})",
                 "reserved " + GPU),
               Q(f"sum by ({by_gpu}) ({j(ctx.m('gpu_memory_total', C))})", "total " + GPU)]),
        Panel(14, "GPU memory per pod", "Memory used on the GPUs of each pod, and per "
              "process where NVML reports processes. One pod growing without traffic is a "
              "leak. dcgm-exporter lists no processes: read through it (as in the demo), the "
              "panel has no per-process lines.", "bytes",
              [Q(f"sum by ({c}, namespace, pod) ({j(ctx.m('gpu_memory_used', C))})",
                 "{{namespace}}/{{pod}}"),
               Q(f"sum by ({c}, pod, pid) ({j(ctx.m('gpu_process_memory', C))})",
                 "{{pod}} pid {{pid}}")]),
        Panel(15, "Engine activity", "DCGM profiling ratios (graphics engine, tensor "
              "cores, DRAM) where dcgm-exporter serves them: low tensor activity at high "
              "utilization means the GPU is busy on something other than matmuls.",
              "percentunit",
              [Q(j(ctx.m("gpu_activity", C)), "{{activity}} " + GPU)], max=1),
        Panel(16, "Total power by node", "Sum of GPU power per node (energy counter rate). "
              "Compare with the rack's power budget.", "watt",
              [Q(f"sum by ({c}, node) ({power})", "{{node}}")]),
        Panel(18, "Model FLOPs utilization (MFU)", "FLOP/s the engine estimates each GPU "
              "ran (vLLM's own estimate from the model's shape and tokens processed) over the "
              "GPU's peak dense bf16 FLOP/s (datasheet figures of the capacity planner's "
              f"presets: {', '.join(GPU_PRESETS)}; other GPUs show no line). Prefill-heavy "
              "traffic runs near the top, decode-heavy traffic far below: compare with the "
              "next panel.", "percentunit",
              [Q(_efficiency(ctx, ("engine_estimated_flops",), "bf16_flops"), "{{pod}}")],
              max=1),
        Panel(19, "Memory bandwidth efficiency", "Bytes per second the engine estimates "
              "each GPU read and wrote over the GPU's peak memory bandwidth. Decoding is "
              "bound by it: near the top, only a smaller model, quantization or more "
              "replicas make tokens faster.", "percentunit",
              [Q(_efficiency(ctx, ("engine_estimated_read_bytes", "engine_estimated_write_bytes"),
                             "bandwidth"), "{{pod}}")], max=1),
    ).row(
        "Saturation",
        Panel(8, "KV-cache usage (5m average)", "KV-cache usage per replica averaged over "
              f"5m. At {kv.number('usage'):g} with at least {kv.number('min_waiting'):g} "
              "request waiting (next panel) it is InferwatchKVCacheSaturated: the engine "
              "preempts; lower max_tokens or add replicas.", "percentunit",
              [Q(f"avg_over_time({ctx.m('engine_kv_cache_usage', E)}[5m])", "{{pod}}")],
              thresholds=above(None, kv.number("usage")), max=1),
        Panel(17, "Requests waiting (5m average)", "Requests queued in each engine, averaged "
              f"over 5m: the other half of InferwatchKVCacheSaturated (at least "
              f"{kv.number('min_waiting'):g}). A queue with a full KV cache is saturation, not "
              "a slow GPU.", "short",
              [Q(f"avg_over_time({ctx.m('engine_requests_waiting', E)}[5m])", "{{pod}}")],
              thresholds=above(None, kv.number("min_waiting"))),
        Panel(9, "Preemptions per request", "Preempted requests per finished request, per "
              f"replica. Above {preempt:g} is InferwatchPreemptionStorm.", "percentunit",
              [Q(f"sum without (reason) ({ctx.rate('engine_preemptions', E)}) / "
                 f"{ctx.r(recording.requests(config, 'pod'), E)}", "{{pod}}")],
              thresholds=above(None, preempt)),
    )  # fmt: skip


def _efficiency(ctx: Ctx, keys: tuple[str, ...], peak: str) -> str:
    """The per-GPU rate of the engine's estimate ``keys`` (summed) over the peak ``peak`` of
    the GPU model the replica runs on, known from ``inferwatch_gpu_info``'s name."""
    c = ctx.config.cluster_label
    done = " + ".join(f"sum by ({c}, pod) ({ctx.rate(key, E)})" for key in keys)
    peaks = " or ".join(
        f"{ctx.m('gpu_info', C, f'name={promql.quoted(gpu.model_name)}')} * "
        f"{promql.number(getattr(gpu, peak))}"
        for gpu in GPU_PRESETS.values()
    )
    return f"({done}) / on ({c}, pod) max by ({c}, pod) ({ctx.on_replica(peaks)})"
