"""Fleet overview: is the fleet serving, how fast, how full, and what is firing.

Panels 1-6 are the ones the availability alerts link to (their ``dashboard_url``).
Rates and quantiles read recording rules; the gauge panels (running and waiting requests,
KV-cache usage) aggregate the replicas' gauges directly: one sample per replica is already
about as cheap as reading a recorded series, and is never an evaluation interval stale
(docs/scaling.md has the measurements).
"""

from __future__ import annotations

from inferwatch.dashboards.panels import (
    Board,
    Ctx,
    Panel,
    Q,
    Scope,
    above,
    below,
    replica_link,
)
from inferwatch.mixin import recording

E, C, M = Scope.ENGINE, Scope.CLUSTER, Scope.MODEL


def board(ctx: Ctx) -> Board:
    config = ctx.config
    errors = config.alert("InferwatchErrorRatioHigh")
    share = config.alert("InferwatchModelReplicasNotReady").number("share")
    kv = config.alert("InferwatchKVCacheSaturated").number("usage")
    preempt = config.alert("InferwatchPreemptionStorm").number("ratio")
    min_errors = config.alert("InferwatchScrapeErrors").number("min_errors")
    floor = config.alert("InferwatchThroughputBelowFloor")
    c = config.cluster_label
    ready = f"min by ({c}, model, pod) ({ctx.m('replica_ready', E)})"
    mv = ctx.by("model", "model_version")
    scrape_errors = ctx.on_replica(f"increase({ctx.m('engine_scrape_errors', C)}[5m])")
    parse_errors = ctx.on_replica(f"increase({ctx.m('engine_scrape_parse_errors', C)}[5m])")
    up = ",".join(m for m in (config.selectors["sidecar_up"], *ctx.matchers(Scope.CLUSTER)) if m)
    firing = ",".join(('alertstate="firing"', *ctx.matchers(Scope.CLUSTER)))
    return (
        Board(
            "fleet",
            "Inferwatch / Fleet overview",
            "Every model version's traffic, latency, saturation and errors, the SLOs and the "
            "alerts firing now. Start here; open a replica from any per-replica series.",
        )
        .row(
            "Availability",
            Panel(
                1,
                "Engines up",
                "1 when the sidecar reached its engine on the last scrape. A 0 "
                "is InferwatchEngineDown: the engine process died or hangs; open the replica, "
                "check the engine's logs and restarts.",
                "bool_yes_no",
                [
                    Q(
                        f"max by ({c}, model, model_version, pod) ({ctx.m('engine_up', E)})",
                        "{{pod}} {{model_version}}",
                    )
                ],
                thresholds=below(1),
                width=6,
                links=[replica_link()],
                kind="state",
                states=("down", "up"),
            ),
            Panel(
                2,
                "Sidecars scraped",
                "Prometheus's own `up` for the sidecar and proxy targets. "
                "A 0 is InferwatchSidecarDown: every signal of that replica is blind; check the "
                "pod and the scrape config.",
                "bool_yes_no",
                [Q(f"up{{{up}}}", "{{job}} {{instance}}")],
                thresholds=below(1),
                width=6,
                kind="state",
                states=("down", "up"),
            ),
            Panel(
                3,
                "Engine scrape errors",
                "Failed scrapes of the engine's /metrics by reason "
                f"over 5m, and unparsable pages. {min_errors:g} or more is InferwatchScrapeErrors: "
                "the engine answers slowly or with a page the sidecar refuses (size, format); "
                "see the sidecar log.",
                "short",
                [
                    Q(
                        ctx.or_zero(f"sum by ({c}, pod, reason) ({scrape_errors})", "pod"),
                        "{{pod}} {{reason}}",
                    ),
                    Q(
                        f"sum by ({c}, pod) ({parse_errors})",
                        "{{pod}} parse errors",
                    ),
                ],
                thresholds=above(None, min_errors),
                width=6,
            ),
            Panel(
                4,
                "Error ratio by model version",
                "Failed requests per request (recorded over "
                f"{ctx.w}). Above {errors.number('warning'):g} warns, above "
                f"{errors.number('critical'):g} pages (InferwatchErrorRatioHigh). Compare "
                "versions: one bad version points at a rollout, all of them at the GPUs or the "
                "gateway.",
                "percentunit",
                [Q(ctx.r(recording.error_ratio(config)), "{{model}} {{model_version}}")],
                thresholds=above(errors.number("warning"), errors.number("critical")),
                width=6,
            ),
            Panel(
                5,
                "Replica readiness by condition",
                "Each /readyz condition (engine, gpu, "
                "quality, ...) per replica; a 0 takes the replica out of every router "
                "(InferwatchReplicaNotReady). The condition that is 0 says which board to "
                "open next.",
                "bool_yes_no",
                [
                    Q(
                        f"min by ({c}, pod, condition) ({ctx.m('replica_ready', E)})",
                        "{{pod}} {{condition}}",
                    )
                ],
                thresholds=below(1),
                width=12,
                links=[replica_link()],
                kind="state",
                states=("not ready", "ready"),
            ),
            Panel(
                6,
                "Share of each model's replicas not ready",
                "Above "
                f"{share:g} pages (InferwatchModelReplicasNotReady): the model's remaining "
                "replicas carry all its traffic and may tip over. Find the common cause "
                "(a node, a version) before restarting pods.",
                "percentunit",
                [
                    Q(
                        f"1 - (sum by ({c}, model) ({ready}) / count by ({c}, model) ({ready}))",
                        "{{model}}",
                    )
                ],
                thresholds=above(None, share),
                width=12,
                max=1,
            ),
        )
        .row(
            "Traffic",
            Panel(
                7,
                "Requests per second",
                "Requests the engines finished or failed, by model "
                "version. A drop with no change in errors usually means the router moved "
                "traffic away (see readiness).",
                "reqps",
                [Q(ctx.r(recording.requests(config)), "{{model}} {{model_version}}")],
                stack=True,
            ),
            Panel(
                8,
                "Input and output tokens per second",
                "Prompt (input) and generated (output) "
                "tokens by model version: the throughput the GPUs deliver.",
                "suffix: tok/s",
                [
                    Q(
                        ctx.r(f"model_version:inferwatch_engine_prompt_tokens:rate{ctx.w}"),
                        "input {{model_version}}",
                    ),
                    Q(
                        ctx.r(f"model_version:inferwatch_engine_generation_tokens:rate{ctx.w}"),
                        "output {{model_version}}",
                    ),
                ],
            ),
            Panel(
                9,
                "Running and waiting requests",
                "Requests in the engines' batches and in "
                "their queues. A queue that grows while running stays flat is saturation: "
                "add replicas or shed load.",
                "short",
                [
                    Q(
                        f"sum {mv} ({ctx.m('engine_requests_running', E)})",
                        "running {{model_version}}",
                    ),
                    Q(
                        f"sum {mv} ({ctx.m('engine_requests_waiting', E)})",
                        "waiting {{model_version}}",
                    ),
                ],
            ),
            Panel(
                19,
                "Output tokens per second by model against the floor",
                "Tokens every replica of a model generated per second together. Under "
                f"{floor.number('tokens_per_second'):g} with requests waiting for "
                f"{floor.for_} is InferwatchThroughputBelowFloor: demand is there and the fleet "
                "delivers too little; see running and waiting requests, then the GPU board "
                "(clocks, PCIe, NVLink) for slow GPUs.",
                "suffix: tok/s",
                [
                    Q(
                        f"sum {ctx.by('model')} "
                        f"({ctx.r(f'model_version:inferwatch_engine_generation_tokens:rate{ctx.w}')})",
                        "{{model}}",
                    )
                ],
                thresholds=below(floor.number("tokens_per_second")),
                width=24,
            ),
        )
        .row(
            "Latency",
            *[
                _latency(ctx, pid, signal, title)
                for pid, signal, title in (
                    (10, "ttft", "Time to first token p50 / p99"),
                    (11, "tpot", "Time per output token p50 / p99"),
                    (12, "e2e", "End-to-end request latency p50 / p99"),
                )
            ],
        )
        .row(
            "Saturation",
            Panel(
                13,
                "KV-cache usage",
                "The fullest replica's KV cache per model version. At "
                f"{kv:g} with requests waiting the engine preempts and queues "
                "(InferwatchKVCacheSaturated); shorten max_tokens or add replicas.",
                "percentunit",
                [
                    Q(
                        f"max {mv} ({ctx.m('engine_kv_cache_usage', E)})",
                        "{{model}} {{model_version}}",
                    )
                ],
                thresholds=above(None, kv),
                max=1,
            ),
            Panel(
                14,
                "Prefix-cache hit rate",
                "Prompt tokens served from the prefix cache per "
                "prompt token looked up. A drop after a deploy means prompts changed or the "
                "cache shrank; time to first token rises with it.",
                "percentunit",
                [
                    Q(
                        f"sum {mv} ({ctx.rate('engine_prefix_cache_hit_tokens', E)}) / sum {mv} "
                        f"({ctx.rate('engine_prefix_cache_queried_tokens', E)})",
                        "{{model}} {{model_version}}",
                    )
                ],
                max=1,
            ),
            Panel(
                15,
                "Preemptions per request",
                "Requests preempted (KV cache full) per finished "
                f"request. Above {preempt:g} is InferwatchPreemptionStorm: work is being thrown "
                "away; see KV-cache usage.",
                "percentunit",
                [
                    Q(
                        f"sum {mv} ({ctx.rate('engine_preemptions', E)}) / "
                        f"sum {mv} ({ctx.r(recording.requests(config, 'pod'), E)})",
                        "{{model}} {{model_version}}",
                    )
                ],
                thresholds=above(None, preempt),
            ),
        )
        .row(
            "SLOs and alerts",
            *_slo(ctx, 16, 17),
            Panel(
                18,
                "Firing alerts",
                "Every inferwatch alert firing now, with its severity. "
                "Each alert's dashboard_url opens the panel that shows it. "
                "Empty (No alert firing) while no alert fires: a healthy fleet shows none.",
                "short",
                [Q(f"sum by ({c}, alertname, severity) (ALERTS{{{firing}}})", instant=True)],
                kind="table",
                width=8,
                no_value="No alert firing",
            ),
        )
        .row("Tuning", _advised(ctx))
    )


def _advised(ctx: Ctx) -> Panel:
    """Per model and setting, what the replicas run with beside what the advisor proposes."""
    c = ctx.config.cluster_label
    by = f"max by ({c}, model, setting)"
    running_replicas = f"count by ({c}, model) ({ctx.m('engine_up', E)} == 1)"
    advised_replicas = f"max by ({c}, model) ({ctx.m('advise_replicas', M)})"
    return Panel(
        20,
        "Advised vs running settings",
        "One row per model and setting: running is the largest value the model's replicas "
        "report (inferwatch_engine_setting, as each engine tells it; a setting an engine does "
        "not tell stays empty), and replicas the ones up; advised is what inferwatch advisor "
        "proposed at its last evaluation that gave advice (docs/advise.md). Advised fewer "
        "replicas or smaller limits: the model is over-provisioned for its load; more: it "
        "misses its SLO as configured. Restart the engine with the advised flags to apply them.",
        "short",
        [
            Q(
                f"{by} ({ctx.m('engine_setting', E)}) or "
                f'label_replace({running_replicas}, "setting", "replicas", "", "")',
                instant=True,
            ),
            Q(
                f"{by} ({ctx.m('advise_setting', M)}) or "
                f'label_replace({advised_replicas}, "setting", "replicas", "", "")',
                instant=True,
            ),
        ],
        kind="table",
        width=24,
        columns=("running", "advised"),
    )


def _latency(ctx: Ctx, pid: int, signal: str, title: str) -> Panel:
    warning = ctx.config.latency_threshold(signal, "warning")
    critical = ctx.config.latency_threshold(signal, "critical")
    return Panel(
        pid, title,
        f"Recorded quantiles over {ctx.w} per model version. The p"
        f"{ctx.config.latency['quantile'] * 100:g} above {warning:g}s warns and above "
        f"{critical:g}s pages (per-model thresholds may differ; see the Latency board). "
        "A rise on one version only points at the rollout; on all, at load or GPUs.", "s",
        [Q(ctx.quantile(signal, q), f"p{q * 100:g} {{{{model_version}}}}") for q in (0.5, 0.99)
         if q in ctx.config.quantiles],
        thresholds=above(warning, critical),
    )  # fmt: skip


def _slo(ctx: Ctx, budget_id: int, burn_id: int) -> list[Panel]:
    """Error budget left over the longest recorded window, and the 1h burn rate."""
    config = ctx.config
    longest = config.slo_windows[-1]
    fastest = config.burn_windows[0]
    slos = (("ttft", "TTFT"), ("availability", "availability"))
    budget = {slo: 1 - float(config.slo[slo]["objective"]) for slo, _ in slos}
    return [
        Panel(budget_id, f"Error budget remaining ({longest})", "Share of each SLO's error "
              f"budget left over the last {longest}: 1 - bad ratio / allowed ratio. Below 0 the "
              "SLO is broken for that window; freeze risky rollouts.", "percentunit",
              [Q(f"1 - {ctx.r(recording.slo_error_ratio(config, slo, longest))} / "
                 f"{budget[slo]:g}", f"{label} {{{{model_version}}}}") for slo, label in slos],
              thresholds=below(0), width=8),
        Panel(burn_id, f"Burn rate ({fastest.long})", "How many times faster than allowed "
              f"each SLO spends its budget over {fastest.long}. Above {fastest.factor:g} (with "
              f"the {fastest.short} window agreeing) pages; the Latency board shows every "
              "window.", "short",
              [Q(f"{ctx.r(recording.slo_error_ratio(config, slo, fastest.long))} / "
                 f"{budget[slo]:g}", f"{label} {{{{model_version}}}}") for slo, label in slos],
              thresholds=above(None, fastest.factor), width=8),
    ]  # fmt: skip
