"""Versions and routing: traffic, latency and cost by model, engine and prompt version.

The board for a rollout: the canary's share of its model's traffic, each version side by
side, and how many replicas of each model are out of rotation.
"""

from __future__ import annotations

from inferwatch.dashboards.panels import Board, Ctx, Panel, Q, Scope
from inferwatch.mixin import recording

E = Scope.ENGINE


def board(ctx: Ctx) -> Board:
    config = ctx.config
    c = config.cluster_label
    requests = ctx.r(recording.requests(config))
    ready = f"min by ({c}, model, pod) ({ctx.m('replica_ready', E)})"
    q = ctx.config.latency["quantile"]
    finished = ctx.rate("engine_requests_finished", E)
    return Board(
        "versions", "Inferwatch / Versions and routing",
        "Traffic, latency and cost by model_version, engine_version and prompt_version, "
        "the canary's share, and replicas out of rotation: the board to watch a rollout on.",
    ).row(
        "Model versions",
        Panel(1, "Traffic share by model version", "Each version's share of its model's "
              "requests: the canary weight the routers actually apply. A canary whose "
              "share falls to 0 was taken out of rotation (see below).", "percentunit",
              [Q(f"{requests} / on ({c}, model) group_left sum by ({c}, model) ({requests})",
                 "{{model}} {{model_version}}")], max=1),
        Panel(2, f"TTFT p{q * 100:g} by model version", "The same quantile per version: "
              "a canary slower than the stable version is the first sign of a bad build "
              "or quantization.", "s",
              [Q(ctx.quantile("ttft", q), "{{model}} {{model_version}}")]),
        Panel(3, "Cost per 1k tokens by model version", "Cost per 1k prompt and "
              "completion tokens: what the new version saves (or costs).", "currencyUSD",
              [Q(ctx.r(recording.cost_per_1k(config)), "{{model}} {{model_version}}")]),
        Panel(4, "Requests per second by model version", "Absolute traffic per version; "
              "a version whose traffic vanishes while its share should not was taken out "
              "of rotation or its route changed.",
              "reqps", [Q(requests, "{{model}} {{model_version}}")], stack=True),
        Panel(5, f"TPOT p{q * 100:g} by model version", "Decode speed per version: a "
              "quantized or speculative-decoding version should be faster here; slower "
              "means roll it back.", "s",
              [Q(ctx.quantile("tpot", q), "{{model}} {{model_version}}")]),
        Panel(6, "Error ratio by model version", "Failed requests per request per version; "
              "errors on the new version only are a rollout problem, roll it back.",
              "percentunit",
              [Q(ctx.r(recording.error_ratio(config)), "{{model}} {{model_version}}")]),
    ).row(
        "Engine and prompt versions",
        Panel(7, "Requests by engine version", "Finished requests per second by engine and "
              "engine version: an engine upgrade rolling through the fleet.", "reqps",
              [Q(f"sum by ({c}, engine, engine_version) ({finished})",
                 "{{engine}} {{engine_version}}")]),
        Panel(8, "Requests by prompt version", "Finished requests per second by prompt "
              "(system prompt / template) version.", "reqps",
              [Q(f"sum by ({c}, model, prompt_version) ({finished})",
                 "{{model}} prompt {{prompt_version}}")]),
        Panel(9, "Replicas in and out of rotation", "Replicas of each model whose /readyz "
              "passes (in rotation) and fails (out of rotation). Out of rotation with no "
              "alert firing means someone isolated it on purpose.", "short",
              [Q(f"sum by ({c}, model) ({ready})", "in {{model}}"),
               Q(f"count by ({c}, model) ({ready}) - sum by ({c}, model) ({ready})",
                 "out {{model}}")]),
    )  # fmt: skip
