"""Engines the user already runs (``inferwatch demo --engine-url``), in the simulators' place.

Each engine is asked at start what it serves (``/v1/models``: the model name and, from vLLM,
``max_model_len``), so that its sidecar, proxy, gateway backend and load carry the engine's
own model. Engines serving the same model are replicas of it; the first model is the
primary one and a second model its fallback, as in the simulated fleet. A real engine takes
no injected faults, so a scenario that injects, crashes, repairs or starts a replica cannot
run on one: only load steps (``rate``) can.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from inferwatch import identity
from inferwatch.clikit import BadInput, CannotRun
from inferwatch.demo.scenario import Scenario
from inferwatch.demo.topology import Replica, Role, Tenant

#: seconds an engine has to answer ``/v1/models`` at start
TIMEOUT_S = 10.0
#: the share of the engine's context a demo request may fill (prompt and completion), leaving
#: room for the chat template and for words that take several tokens
CONTEXT_SHARE = 0.5
#: tokens a prompt word of the load generator takes at most, as the fitting assumes
TOKENS_PER_WORD = 2
ROLES: tuple[Role, ...] = ("primary", "fallback")


@dataclass(frozen=True)
class Engine:
    """What an engine the user runs serves, as it says itself."""

    url: str
    model: str
    max_model_len: int | None  # None: the engine does not say (llama.cpp's server)


def base_url(url: str) -> str:
    """An ``--engine-url`` as a base URL; BadInput for anything but http(s)://HOST[:PORT]."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"--engine-url {url!r}: expected http(s)://HOST:PORT of an engine")
    return url.rstrip("/").removesuffix("/v1")


def discover(url: str, http: httpx.Client) -> Engine:
    """Ask the engine at ``url`` (a base URL) what it serves; CannotRun when it cannot say."""
    try:
        response = http.get(url + "/v1/models", timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise CannotRun(f"--engine-url {url}: no answer on /v1/models ({exc})") from None
    if response.status_code != 200:
        raise CannotRun(f"--engine-url {url}: /v1/models answered {response.status_code}")
    try:
        first: Any = response.json()["data"][0]
        model = first["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise CannotRun(f"--engine-url {url}: /v1/models lists no model") from None
    if not isinstance(model, str) or not model:
        raise CannotRun(f"--engine-url {url}: /v1/models lists no model")
    context = first.get("max_model_len") if isinstance(first, dict) else None
    valid = isinstance(context, int) and not isinstance(context, bool) and context > 0
    return Engine(url, model, context if valid else None)


def replicas(engines: Sequence[Engine]) -> tuple[Replica, ...]:
    """One replica per engine (``engine-1``, ...): the first model primary, a second one its
    fallback; BadInput for a third model, which the gateway would have nowhere to route."""
    roles: dict[str, Role] = {}
    for engine in engines:
        if engine.model not in roles:
            if len(roles) == len(ROLES):
                raise BadInput(
                    f"--engine-url {engine.url} serves {engine.model}, a third model: the demo "
                    f"routes a primary model ({next(iter(roles))}) and its fallback only"
                )
            roles[engine.model] = ROLES[len(roles)]
    count = {model: sum(e.model == model for e in engines) for model in roles}
    return tuple(
        Replica(
            name=f"engine-{index}",
            role=roles[engine.model],
            model=engine.model,
            version=identity.UNKNOWN,  # the deployment's to say; the engine cannot
            gpu="none",
            node=urlsplit(engine.url).hostname or identity.UNKNOWN,
            weight=1 / count[engine.model],
            engine_url=engine.url,
        )
        for index, engine in enumerate(engines, start=1)
    )


def check_scenario(scenario: Scenario) -> None:
    """BadInput when the scenario needs the simulator (anything but load steps)."""
    for step in scenario.steps:
        if step.action != "rate":
            raise BadInput(
                f"scenario {scenario.name}: {step.action} at {step.at:g}s needs the simulator's "
                f"fault injection and cannot run on a real engine (--engine-url); use "
                f"--scenario none or a scenario of rate steps only"
            )


def fitted(tenants: Sequence[Tenant], engines: Sequence[Engine]) -> tuple[Tenant, ...]:
    """The tenants' prompt and completion lengths scaled down, where needed, so that every
    request fits the smallest context the engines state: a request the engine refuses as too
    long shows nothing about the product."""
    contexts = [e.max_model_len for e in engines if e.max_model_len is not None]
    if not contexts:
        return tuple(tenants)
    room = CONTEXT_SHARE * min(contexts)
    result = []
    for tenant in tenants:
        longest = tenant.prompt_words[1] * TOKENS_PER_WORD + tenant.max_tokens[1]
        scale = min(1.0, room / longest)
        result.append(
            dataclasses.replace(
                tenant,
                prompt_words=_scaled(tenant.prompt_words, scale),
                max_tokens=_scaled(tenant.max_tokens, scale),
            )
        )
    return tuple(result)


def _scaled(bounds: tuple[int, int], scale: float) -> tuple[int, int]:
    return (max(1, int(bounds[0] * scale)), max(1, int(bounds[1] * scale)))
