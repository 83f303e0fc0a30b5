"""Quality: golden-answer probes per model x version x replica, and live degeneracy.

Panels 1-3 are the ones the quality alerts link to (their ``dashboard_url``). Probe series
name the probed replica ``target``; the replica variable matches it.
"""

from __future__ import annotations

from inferwatch.dashboards.panels import Board, Ctx, Panel, Q, Scope, above

P = Scope.PROBE
PROBE = "{{model_version}} {{target}} {{route}}"


def board(ctx: Ctx) -> Board:
    config = ctx.config
    c = config.cluster_label
    margin = config.alert("InferwatchProbePassRateBelowBaseline").number("margin")
    degenerate = config.alert("InferwatchDegenerateOutputRising").number("ratio")
    mv = ctx.by("model", "model_version")
    sampled = ctx.rate("quality_sampled_outputs", Scope.MODEL_VERSION)
    return Board(
        "quality", "Inferwatch / Quality",
        "Probe verdicts and pass rates per model x version x replica, which checks fail, "
        "and the degenerate share of live completions the proxies screen.",
    ).row(
        "Verdicts",
        Panel(1, "Probe verdicts failing", "1 where the windowed verdict is fail. Through "
              "the router it pages (users see it); on one replica it warns and /readyz takes "
              "that replica out. Open the failing checks below.", "bool_yes_no",
              [Q(f"max by ({c}, model, model_version, target, route, state) "
                 f"({ctx.m('probe_verdict', P)})", PROBE + " {{state}}")],
              thresholds=above(None, 1)),
        Panel(2, "Probe pass rate against baseline", "Windowed pass rate per model x version "
              f"x replica, and the expected rate minus {margin:g} (the alert line of "
              "InferwatchProbePassRateBelowBaseline). Below the line after a rollout: roll "
              "back that version. No alert line until the version's baseline is captured, "
              "over its first probe cycles.", "percentunit",
              [Q(ctx.m("probe_pass_ratio", P), PROBE),
               Q(f"{ctx.m('probe_expected_pass_ratio', P)} - {margin:g}",
                 "alert line " + PROBE)], max=1),
        Panel(3, "Degenerate live outputs", "Share of screened live completions flagged "
              f"degenerate, by signal. Above {degenerate:g} is "
              "InferwatchDegenerateOutputRising: the model answers in repetitions, the wrong "
              "script or runaway length; compare versions and roll back.", "percentunit",
              [Q(f"sum by ({c}, model, model_version, signal) "
                 f"({ctx.rate('quality_degenerate_outputs', Scope.MODEL_VERSION)}) / "
                 f"ignoring (signal) group_left sum {mv} ({sampled})",
                 "{{model_version}} {{signal}}")],
              thresholds=above(None, degenerate), max=1),
    ).row(
        "Probes",
        Panel(4, "Failures by check", "Probe checks failing per second, cheapest first: "
              "transport, degeneracy, structure, answer. Transport failures are an outage, "
              "answer failures a model problem.", "short",
              [Q(f"sum by ({c}, model_version, target, check) "
                 f"({ctx.rate('probe_check_failures', P)})", "{{target}} {{check}}")]),
        Panel(5, "Probe runs by result", "Probes run per second by result. No runs at all "
              "means the probe schedule stopped or its token budget ran out.", "short",
              [Q(f"sum by ({c}, model_version, target, result) "
                 f"({ctx.rate('probe_runs', P)})", "{{target}} {{result}}")], stack=True),
        Panel(6, "Probe latency p99", "End-to-end and first-token latency of probe "
              "requests: the latency a user would see on that route.", "s",
              [Q(f"histogram_quantile(0.99, sum by ({c}, target, route, le) "
                 f"({ctx.rate('probe_duration', P, suffix='_bucket')}))",
                 "total {{target}} {{route}}"),
               Q(f"histogram_quantile(0.99, sum by ({c}, target, route, le) "
                 f"({ctx.rate('probe_ttft', P, suffix='_bucket')}))",
                 "TTFT {{target}} {{route}}")]),
        Panel(7, "Screened live outputs", "Live completions per second the proxies screen "
              "for degeneracy; the base of the degenerate share above.", "short",
              [Q(f"sum {mv} ({sampled})", "{{model}} {{model_version}}")]),
        Panel(8, "Probe token budget remaining", "Tokens the probe runner may still spend "
              "in its window; at 0 probes are skipped and verdicts go stale.", "short",
              [Q(ctx.on_replica(ctx.m("probe_budget_remaining", Scope.CLUSTER)), "{{pod}}")]),
    )  # fmt: skip
