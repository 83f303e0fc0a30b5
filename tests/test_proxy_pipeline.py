"""Admission's pipeline without a server: the order of its stages, and what each lets
through or refuses (with fakes for the engine and the fleet's books)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.admission import Refusal, Reservation
from inferwatch.proxy.assembly import build
from inferwatch.proxy.config import Budget
from inferwatch.proxy.exchange import Exchange
from inferwatch.proxy.pipeline import Admission, Admitted, Admitting, Stage
from inferwatch.proxy.ratelimit import Bucket, Levels
from inferwatch.proxy.usage import TEMPLATE_ALLOWANCE

pytestmark = pytest.mark.unit

CHAT = "/v1/chat/completions"
#: a prompt whose byte bound is over 200 tokens
LONG = {"messages": [{"role": "user", "content": "x" * 400}]}
ALL_STAGES = [
    "measure",
    "limit_input",
    "plan_completion",
    "limit_rate",
    "reserve",
    "bound_meter",
    "take_slot",
]


class Engine:
    """An engine that lists no context length and counts prompts as told (None: it cannot)."""

    completes_to_context = False

    def __init__(self, counts: int | None = None) -> None:
        self.counts = counts
        self.counted = 0

    async def count(self, path: str, body: Any) -> int | None:
        self.counted += 1
        return self.counts

    async def context(self, model: str) -> int | None:
        return None


class FleetBooks:
    """Books that hold slots and check rate buckets in their reservation, as Redis does."""

    holds_slots = True
    checks_rates = True

    def __init__(self, levels: Levels | None = None) -> None:
        self.levels = levels
        self.asked: list[dict[str, Any]] = []
        self.cancelled: list[Reservation] = []

    async def reserve(
        self,
        tenant: str,
        budget: Budget | None,
        prompt: int,
        completion_cap: int,
        choices: int = 1,
        clamp: bool = True,
        most: int = 0,
        rate: Sequence[Bucket] = (),
        rate_tokens: int = 0,
    ) -> tuple[Reservation | Refusal, Levels | None]:
        self.asked.append({"most": most, "rate": list(rate), "rate_tokens": rate_tokens})
        tokens = prompt + completion_cap * choices
        return Reservation(tenant, 0.0, tokens, fleet_slot=most > 0), self.levels

    def cancel(self, reservation: Reservation, budget: Budget | None) -> None:
        self.cancelled.append(reservation)

    def room(self, tenant: str, budget: Budget) -> int:
        return 1 << 30

    def settle(self, reservation: Reservation, budget: Budget | None, tokens: int) -> None:
        pass

    def remaining(self, tenant: str, budget: Budget) -> int:
        return 0


def admission(tenant: dict[str, Any] | None = None, **limits: Any) -> Admission:
    """The admission of a proxy whose one tenant, acme, is configured as ``tenant``."""
    document = {
        "upstream": {"url": "http://127.0.0.1:9"},
        "tenants": {"acme": {"key_sha256": ["0" * 64], **(tenant or {})}},
        "limits": limits,
    }
    built = build(proxy_config.parse(document, "p.yaml"), access_log=False).admission
    built.engine = Engine()  # type: ignore[assignment]
    return built


def admit(
    admitting: Admission, max_tokens: Any = 10, **fields: Any
) -> tuple[Admitted | Refusal, Exchange, dict[str, Any]]:
    exchange = Exchange(start=0.0, path=CHAT, tenant="acme", model="m")
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body.update(fields)
    return asyncio.run(admitting.admit(exchange, body, 64)), exchange, body


def refused(answer: Admitted | Refusal) -> str:
    assert isinstance(answer, Refusal), f"admitted: {answer}"
    return answer.reason


# ---------------------------------------------------------------------------- the pipeline
def test_the_stages_run_in_order_and_those_with_nothing_to_check_are_left_out() -> None:
    full = admission({"rate_limits": {"requests_per_minute": 5}}, max_input_tokens=100)
    assert [stage.__name__ for stage in full.stages] == ALL_STAGES
    bare = admission()
    assert [stage.__name__ for stage in bare.stages] == [
        name for name in ALL_STAGES if name not in ("limit_input", "limit_rate")
    ]


def recording(admitting: Admission) -> list[str]:
    """The names of the stages run, in the order they ran."""
    ran: list[str] = []

    def wrapped(stage: Stage) -> Stage:
        async def run(owner: Admission, request: Admitting) -> Refusal | None:
            ran.append(stage.__name__)
            return await stage(owner, request)

        run.__name__ = stage.__name__
        return run

    admitting.stages = tuple(wrapped(stage) for stage in admitting.stages)
    return ran


@pytest.mark.parametrize(
    ("fields", "reason", "last"),
    [
        ({"max_tokens": "ten"}, "rejected_bad_request", "measure"),
        (
            {"messages": [{"role": "user", "content": "x" * 400}]},
            "rejected_too_long",
            "limit_input",
        ),
        ({"n": 200}, "rejected_bad_request", "plan_completion"),
        ({"max_tokens": 10_000}, "rejected_budget", "reserve"),
    ],
)
def test_a_refusal_ends_the_pipeline_at_its_stage(
    fields: dict[str, Any], reason: str, last: str
) -> None:
    """Nothing after the refusing stage runs: no rate bucket is taken for a request too long,
    no slot for one over budget; and a refused request is left no meter to charge."""
    admitting = admission(
        {"budget": {"tokens": 1000, "window": "1h"}, "rate_limits": {"requests_per_minute": 5}},
        max_input_tokens=200,
        over_budget="reject",
    )
    ran = recording(admitting)
    answer, exchange, _ = admit(admitting, **fields)
    assert refused(answer) == reason
    assert ran == ALL_STAGES[: ALL_STAGES.index(last) + 1]
    assert exchange.meter is None
    assert admitting.gate.in_flight == 0


def test_an_admitted_request_passes_every_stage() -> None:
    admitting = admission({"rate_limits": {"requests_per_minute": 5}}, max_input_tokens=200)
    ran = recording(admitting)
    answer, exchange, _ = admit(admitting)
    assert answer == Admitted(changed=False)
    assert ran == ALL_STAGES
    assert exchange.meter is not None and exchange.slot == "counted"


# ---------------------------------------------------------------------------- each stage
def test_measure_refuses_a_cap_that_is_no_whole_number_and_normalises_one_that_is() -> None:
    answer, _, _ = admit(admission(), max_tokens=2.5)
    assert refused(answer) == "rejected_bad_request"
    answer, exchange, body = admit(admission(), max_tokens=12.0, n=2.0)
    assert answer == Admitted(changed=True)  # sent re-encoded, as ints
    assert type(body["max_tokens"]) is int and body["n"] == 2 and exchange.choices == 2


def test_limit_input_asks_the_engine_to_count_a_bound_before_it_refuses() -> None:
    admitting = admission(max_input_tokens=200)
    answer, _, _ = admit(admitting, **LONG)
    assert refused(answer) == "rejected_too_long"
    assert "may be up to" in answer.message  # type: ignore[union-attr]
    admitting.engine = Engine(counts=150)  # type: ignore[assignment]
    answer, exchange, _ = admit(admitting, **LONG)
    assert isinstance(answer, Admitted)
    assert exchange.meter is not None and exchange.meter.prompt_counted


def test_plan_completion_holds_a_budget_to_its_most_choices_and_nobody_else() -> None:
    budgeted = admission({"budget": {"tokens": 10**9, "window": "1h"}})
    answer, _, _ = admit(budgeted, n=129)
    assert refused(answer) == "rejected_bad_request"
    assert isinstance(admit(budgeted, n=128)[0], Admitted)
    assert isinstance(admit(admission(), n=129)[0], Admitted)


def test_plan_completion_counts_a_bound_exactly_before_the_budget_would_clamp_it() -> None:
    admitting = admission({"budget": {"tokens": 48, "window": "1h"}})
    engine = admitting.engine = Engine(counts=5)  # type: ignore[assignment]
    answer, _, body = admit(admitting, max_tokens=40)
    assert answer == Admitted(changed=False)  # 5 + 40 fits: the bound (10) + 40 would not
    assert engine.counted == 1 and body["max_tokens"] == 40


def test_limit_rate_refuses_a_tenant_out_of_requests_with_its_headers() -> None:
    admitting = admission({"rate_limits": {"requests_per_minute": 1}})
    answer, exchange, _ = admit(admitting)
    assert isinstance(answer, Admitted)
    assert dict(exchange.rate_headers)[b"x-ratelimit-remaining-requests"] == b"0"
    answer, exchange, _ = admit(admitting)
    assert refused(answer) == "rejected_rate_limit"
    assert answer.retry_after  # type: ignore[union-attr]
    assert dict(exchange.rate_headers)[b"x-ratelimit-limit-requests"] == b"1"


def test_limit_rate_leaves_the_check_to_books_that_make_it_with_the_reservation() -> None:
    admitting = admission(
        {"budget": {"tokens": 1000, "window": "1h"}, "rate_limits": {"requests_per_minute": 1}}
    )
    books = admitting.ledger = FleetBooks(Levels(True, (0.0,)))
    for _ in range(3):  # this proxy's own bucket (one request) is never taken
        answer, exchange, _ = admit(admitting)
        assert isinstance(answer, Admitted)
        assert exchange.rate_taken is not None and exchange.rate_taken.shared
    assert [asked["rate"] for asked in books.asked] == [[Bucket("", "requests", 1)]] * 3
    assert books.asked[0]["rate_tokens"] > 10


def test_reserve_cancels_a_reservation_its_rate_check_refused() -> None:
    admitting = admission(
        {"budget": {"tokens": 1000, "window": "1h"}, "rate_limits": {"requests_per_minute": 1}}
    )
    books = admitting.ledger = FleetBooks(Levels(False, (0.0,), 5.0))
    answer, exchange, _ = admit(admitting)
    assert refused(answer) == "rejected_rate_limit"
    assert answer.retry_after == 5  # type: ignore[union-attr]
    assert len(books.cancelled) == 1 and exchange.reservation is None


def test_reserve_clamps_the_cap_into_the_body_or_refuses_as_configured() -> None:
    budget = {"budget": {"tokens": 100, "window": "1h"}}
    answer, exchange, body = admit(admission(budget), max_tokens=1000, max_completion_tokens=900)
    assert answer == Admitted(changed=True)
    assert 0 < body["max_tokens"] == body["max_completion_tokens"] < 100  # no twin uncapped
    assert exchange.reservation is not None
    answer, exchange, _ = admit(admission(budget, over_budget="reject"), max_tokens=1000)
    assert refused(answer) == "rejected_budget" and exchange.reservation is None


def test_reserve_sends_the_default_cap_where_the_engine_would_apply_none() -> None:
    answer, _, body = admit(
        admission({"budget": {"tokens": 10**6, "window": "1h"}}, default_max_tokens=50),
        max_tokens=None,
    )
    assert answer == Admitted(changed=True) and body["max_tokens"] == 50
    answer, _, body = admit(admission(), max_tokens=None)  # no budget: nothing to hold it to
    assert answer == Admitted(changed=False) and "max_tokens" not in body


def test_bound_meter_ceils_the_completion_at_the_cap_times_the_choices() -> None:
    admitting = admission()
    answer, exchange, body = admit(admitting, max_tokens=10, n=3)
    assert isinstance(answer, Admitted) and exchange.meter is not None
    bounds = exchange.meter.bounds
    assert bounds.completion_ceiling == 30
    assert bounds.prompt_ceiling == admitting.counter.count(body) + TEMPLATE_ALLOWANCE


def test_take_slot_refuses_a_tenant_at_its_cap_until_a_slot_is_released() -> None:
    admitting = admission({"max_concurrency": 1})
    answer, first, _ = admit(admitting)
    assert isinstance(answer, Admitted) and first.slot == "gated"
    answer, _, _ = admit(admitting)
    assert refused(answer) == "rejected_concurrency"
    admitting.release(first)
    assert isinstance(admit(admitting)[0], Admitted)


def test_take_slot_leaves_a_cap_held_fleet_wide_to_the_reservation() -> None:
    admitting = admission({"max_concurrency": 1})
    books = admitting.ledger = FleetBooks()
    for _ in range(2):
        answer, exchange, _ = admit(admitting)
        assert isinstance(answer, Admitted) and exchange.slot == "gated"
    assert [asked["most"] for asked in books.asked] == [1, 1]
