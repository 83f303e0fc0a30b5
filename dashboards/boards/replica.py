"""Replica drill-down: one replica's engine, sidecar and GPUs side by side.

The view an on-call engineer opens from an alert: pick the replica (or follow a data link
from another board) and read down the columns for the first thing that changed.
"""

from __future__ import annotations

from inferwatch.dashboards.panels import Board, Ctx, Panel, Q, Scope, above, below
from inferwatch.mixin import recording

E, C = Scope.ENGINE, Scope.CLUSTER


def _p99(ctx: Ctx, key: str) -> str:
    bucket = ctx.m(key, E, suffix="_bucket")
    return (f"histogram_quantile(0.99, sum by ({ctx.config.cluster_label}, pod, le) "
            f"(rate({bucket}[$__rate_interval])))")  # fmt: skip


def _per_replica(ctx: Ctx, key: str, *labels: str) -> str:
    """The rate of counter ``key`` summed per replica (engine ranks added up)."""
    return f"sum {ctx.by('pod', *labels)} ({ctx.rate(key, E)})"


def board(ctx: Ctx) -> Board:
    config = ctx.config
    c = config.cluster_label
    pod = ctx.by("pod")
    kv = config.alert("InferwatchKVCacheSaturated").number("usage")
    xid_window = config.alert("InferwatchGPUXidErrors").text("window")
    temp_margin = config.alert("InferwatchGPUTemperatureNearSlowdown").number("margin")
    stamps = ctx.m("replica_startup_phase_timestamp", E)
    started = ctx.m("replica_startup_phase_timestamp", E, 'phase="process_start"')
    on_pod = f"on ({c}, pod)"
    return Board(
        "replica", "Inferwatch / Replica drill-down",
        "One replica's engine, sidecar and GPUs side by side. Choose the replica (or come "
        "here from an alert or a per-replica series) and look for the first signal that "
        "moved.",
    ).row(
        "Engine",
        Panel(1, "Requests and errors per second", "What the engine finished or failed; "
              "errors by reason. Errors with no traffic change point at the engine or GPU; "
              "a traffic drop at the router.", "reqps",
              [Q(ctx.r(recording.requests(config, "pod"), E), "requests {{pod}}"),
               Q(ctx.or_zero(f"sum by ({c}, pod, reason) "
                             f"({ctx.rate('engine_request_errors', E)})", "pod"),
                 "errors {{reason}}")]),
        Panel(2, "TTFT and TPOT p99", "This replica's own quantiles (from its histograms, "
              "not the per-version recordings). Thresholds: the TTFT alert's.", "s",
              [Q(_p99(ctx, "engine_time_to_first_token"), "TTFT p99 {{pod}}"),
               Q(_p99(ctx, "engine_time_per_output_token"), "TPOT p99 {{pod}}")],
              thresholds=above(config.latency_threshold("ttft", "warning"),
                               config.latency_threshold("ttft", "critical"))),
        Panel(3, "Running, waiting, KV cache", "Batch and queue depth, and KV-cache usage "
              f"(a 0-1 fraction). Usage near {kv:g} with a queue means preemptions next.",
              "short",
              [Q(f"sum {pod} ({ctx.m('engine_requests_running', E)})", "running"),
               Q(f"sum {pod} ({ctx.m('engine_requests_waiting', E)})", "waiting"),
               Q(f"max {pod} ({ctx.m('engine_kv_cache_usage', E)})", "KV-cache usage")]),
    ).row(
        "Speculative decoding",
        Panel(14, "Draft acceptance rate", "Share of the drafted tokens the model accepted, "
              "overall, and by draft position the share of drafts whose token there was kept "
              "(position 0 is the first speculated token). A falling rate spends GPU on "
              "drafts thrown away: a worse draft model, or traffic it predicts poorly. Empty "
              "for a replica that does not speculate.", "percentunit",
              [Q(f"{_per_replica(ctx, 'engine_spec_decode_accepted_tokens')}\n/ "
                 f"{_per_replica(ctx, 'engine_spec_decode_draft_tokens')}", "all {{pod}}"),
               Q(f"{_per_replica(ctx, 'engine_spec_decode_position_accepted_tokens', 'position')}"
                 f"\n/ {on_pod} group_left "
                 f"{_per_replica(ctx, 'engine_spec_decode_drafts')}",
                 "position {{position}} {{pod}}")], max=1, width=12),
        Panel(15, "Mean accepted length", "Tokens each decode step yields per request: 1 "
              "(the model's own) plus the draft tokens accepted. 1 means speculation buys "
              "nothing; the ceiling is 1 + the draft length.", "short",
              [Q(f"1 + {_per_replica(ctx, 'engine_spec_decode_accepted_tokens')}\n/ "
                 f"{_per_replica(ctx, 'engine_spec_decode_drafts')}", "{{pod}}")], width=12),
    ).row(
        "Sidecar",
        Panel(4, "Readiness by condition", "The sidecar's /readyz conditions. The one at 0 "
              "is why routers skip this replica: engine (down or hung), gpu (XID, ECC, lost "
              "GPU), quality (probes failing), or isolated by automation.", "bool_yes_no",
              [Q(f"min by ({c}, pod, condition) ({ctx.m('replica_ready', E)})",
                 "{{condition}}")], thresholds=below(1), kind="state",
              states=("not ready", "ready")),
        Panel(5, "Engine up and collectors", "Engine reachability and each collector's last "
              "run (1 ok). A collector at 0 leaves its panels empty here: check the sidecar "
              "log for its error.", "bool_yes_no",
              [Q(f"max {pod} ({ctx.m('engine_up', E)})", "engine up"),
               Q(ctx.on_replica(ctx.m("collector_success", C)), "collector {{collector}}")],
              thresholds=below(1)),
        Panel(6, "Scrape cost", "How long each collector takes. A slow engine scrape "
              "delays every signal of this replica and can time out Prometheus's scrape.",
              "s",
              [Q(ctx.on_replica(ctx.m("collector_duration", C)), "{{collector}}")]),
    ).row(
        "GPU",
        Panel(7, "GPU utilization and memory", "Utilization (0-1) of this replica's GPUs "
              "and their memory in use. Busy GPUs with slow tokens: see clocks and "
              "temperature on the GPU board.", "percentunit",
              [Q(ctx.on_replica(ctx.m("gpu_utilization", C)), "util {{gpu_uuid}}"),
               Q(ctx.on_replica(ctx.m("gpu_memory_utilization", C)), "memory {{gpu_uuid}}")],
              max=1),
        Panel(8, "Temperature and power", "Degrees C and watts of this replica's GPUs. "
              f"Within {temp_margin:g} C of the slowdown threshold the GPU is about to "
              "throttle.", "celsius",
              [Q(ctx.on_replica(ctx.m("gpu_temperature", C, 'sensor="gpu"')),
                 "temp {{gpu_uuid}}"),
               Q(ctx.on_replica(ctx.m("gpu_power", C)), "W {{gpu_uuid}}")]),
        Panel(9, "GPU health and XIDs", "1 while the GPU is healthy (0 with the reason), "
              f"and XID errors in the last {xid_window} by action. Any reset_gpu or reboot_node "
              "XID "
              "means drain and repair the GPU, not restart the engine.", "short",
              [Q(ctx.on_replica(f"min without (reason) ({ctx.m('gpu_healthy', C)})"),
                 "healthy {{gpu_uuid}}"),
               Q(f"sum by ({c}, pod, action) ("
                 + ctx.on_replica(ctx.new_in(ctx.m("gpu_xid_errors", C), xid_window)) + ")",
                 "XID {{action}}")],
              thresholds=below(1)),
    ).row(
        "Start-up",
        Panel(11, "Start-up phases", "Seconds from the sidecar's start to each cold-start "
              "phase this replica reached: engine_reachable (it answers), engine_healthy "
              "(model loaded), warmup_done (ready for traffic), serving (its first client "
              "request succeeded). A phase missing here has not been reached yet.", "s",
              [Q(f"max by ({c}, pod, phase) ({stamps})\n- {on_pod} group_left "
                 f"max by ({c}, pod) ({started})", "{{phase}}", instant=True)],
              kind="stat"),
        Panel(12, "Current phase", "1 on the phase the replica reached last. Started but not "
              "ready: engine_reachable (loading) or engine_healthy (warming up, see the "
              "warmup readiness condition); ready but idle: warmup_done; serving: clients "
              "are served.", "short",
              [Q(f"max by ({c}, pod, phase) ({ctx.m('replica_startup_phase', E)})",
                 "{{phase}}")], max=1),
        Panel(13, "Warm-up requests", "Requests the sidecar sent the engine to warm it up, "
              "by outcome (ok, http_status, timeout, ...): GPU work that is no client "
              "traffic. Failing outcomes keep the replica unready and are retried.", "short",
              [Q(f"sum by ({c}, pod, outcome) ("
                 + ctx.on_replica(ctx.m("warmup_requests", C)) + ")", "{{outcome}}")]),
    ).row(
        "Quality",
        Panel(10, "Probe pass rate", "Golden-answer probes of this replica (windowed pass "
              "rate) against their expected rate. Below it the verdict fails and /readyz "
              "takes the replica out; see the Quality board for the failing checks. No "
              "expected line until the version's baseline is captured, over its first probe "
              "cycles.",
              "percentunit",
              [Q(ctx.m("probe_pass_ratio", Scope.PROBE), "{{route}} {{set}}"),
               Q(ctx.m("probe_expected_pass_ratio", Scope.PROBE), "expected {{set}}")],
              max=1, width=24),
    )  # fmt: skip
