"""The warm-up gate: run the engine's cold paths before the replica takes traffic.

A freshly loaded engine pays one-time costs on the first request of each shape: CUDA graph
capture or compilation for a batch size it has not run yet, KV-cache pages touched for the
first time, kernels autotuned. Unless something else pays them first, a user's request does.
So before ``/readyz`` turns ready the sidecar sends a configured set of small requests to the
engine's OpenAI-compatible API: every prompt length (short and long) at every batch size,
each batch sent concurrently, a few output tokens each.

Each round first reads the engine's model list: a prompt length that cannot fit the model's
context (vLLM's ``max_model_len``, less the answer's ``max_tokens``) is fitted to it, so that
the default lengths warm a small-context model instead of failing forever. Lengths are given
in words; the tokens per word of this engine's tokenizer are learnt from the usage of the
answers to the shorter prompts, which go first.

One *round* sends the shapes one after another and succeeds when every request succeeds
within the round's deadline. A failed round keeps the ``warmup`` readiness condition failing
with its reason, and the next round follows after an exponential backoff. Every request is
bounded (the round's deadline, a cap on the response body read as it arrives, asynchronous
I/O only) and counted in ``inferwatch_warmup_requests_total``, its tokens (from each answer's
usage) in ``inferwatch_warmup_tokens_total``: warm-up spends GPU time and must not be taken
for client traffic, neither by the phases (:mod:`inferwatch.exporters.startup.phases`) nor by the
tenancy proxy's reconciliation with the engine's token counters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.logs import log_event
from inferwatch.probes.client import error_message
from inferwatch.serving.page_fetch import ScrapeFailure, read_bounded
from inferwatch.serving.readiness import Condition

logger = logging.getLogger("inferwatch.warmup")

CONDITION = "warmup"
WAITING = Condition(CONDITION, False, "waiting for the engine to load the model")
#: a warm-up answer (a few tokens) larger than this is refused; so is a model list
MAX_RESPONSE_BYTES = 256 * 1024
#: seconds before the first retry of a failed round; doubled after each failure, up to the max
BACKOFF_INITIAL_S = 2.0
BACKOFF_MAX_S = 60.0
#: a usage count above this in one answer is not believed (a few tokens were asked for)
MAX_USAGE_TOKENS = 10_000_000
#: share of the context a fitted prompt may fill, for the error in the learnt tokens per word
FIT_MARGIN = 0.9


@dataclass(frozen=True)
class WarmupPlan:
    """What one round sends: ``batch_sizes`` x ``prompt_tokens`` shapes.

    Prompt lengths are in words of a plain English text, about one token each with the common
    tokenizers; each request's prompt starts differently, so the prefix cache cannot share
    their KV blocks and the long prompts really allocate them.
    """

    batch_sizes: tuple[int, ...]
    prompt_tokens: tuple[int, ...] = (16, 1024)
    max_tokens: int = 4
    deadline_s: float = 120.0

    @property
    def requests(self) -> int:
        return sum(self.batch_sizes) * len(self.prompt_tokens)

    def shapes(self) -> list[tuple[int, int]]:
        """(prompt words, batch size) in the order they are sent: short prompts first."""
        return [(p, b) for p in sorted(self.prompt_tokens) for b in self.batch_sizes]


class WarmupFailure(Exception):
    """One request of a round failed; ``outcome`` is its label value on the requests counter."""

    def __init__(self, outcome: str, detail: str):
        super().__init__(f"{outcome}: {detail}")
        self.outcome = outcome
        self.detail = detail


def prompt(words: int, number: int) -> str:
    """About ``words`` tokens, starting with the request's number."""
    return f"Warm-up request {number}: " + " ".join(["hello"] * max(words - 3, 1))


class Warmup:
    """Runs rounds until one succeeds, and reports them as a condition and metrics."""

    def __init__(
        self,
        plan: WarmupPlan,
        base_url: str,
        model: str | None,
        *,
        http: httpx.AsyncClient | None = None,
    ):
        self.plan = plan
        self.base_url = base_url.rstrip("/")
        self.model = model or None
        self.http = http or httpx.AsyncClient(
            headers={"User-Agent": "inferwatch-warmup"}, follow_redirects=False
        )
        #: requests sent, and their outcomes as they ended (ok, timeout, http_status, ...)
        self.sent = 0
        self.outcomes: Counter[str] = Counter()
        #: tokens the engine's answers report (usage), by type: prompt, completion
        self.tokens: Counter[str] = Counter()
        #: when the token counters began (their ``_created`` samples; see ProbeMetrics)
        self.tokens_since = time.time()
        self.rounds = 0
        self.done = False
        self.state = WAITING
        #: the engine's context (max_model_len) and its tokenizer's tokens per prompt word
        self.context: int | None = None
        self.tokens_per_word = 1.0

    # ---- the rounds ------------------------------------------------------------------------

    def reset(self) -> None:
        """The engine restarted: it is cold again, and the gate closed until a round passes.
        The counts go on (they are counters)."""
        self.done = False
        self.state = WAITING

    async def run_until_done(self) -> None:
        """Rounds with exponential backoff between failures, until one succeeds."""
        backoff = BACKOFF_INITIAL_S
        while True:
            self.rounds += 1
            self.state = Condition(CONDITION, False, f"warming up (round {self.rounds})")
            started = time.monotonic()
            try:
                await self.round()
            except WarmupFailure as failure:
                reason = f"warm-up round {self.rounds} failed: {failure}; retry in {backoff:g}s"
                self.state = Condition(CONDITION, False, reason)
                log_event(
                    logger,
                    logging.WARNING,
                    "warm-up failed; replica stays unready",
                    round=self.rounds,
                    outcome=failure.outcome,
                    detail=failure.detail,
                    retry_in_s=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            took = time.monotonic() - started
            self.done = True
            self.state = Condition(
                CONDITION, True, f"{self.plan.requests} warm-up requests succeeded in {took:.1f}s"
            )
            log_event(
                logger,
                logging.INFO,
                "warm-up done",
                round=self.rounds,
                requests=self.plan.requests,
                seconds=round(took, 3),
            )
            return

    async def round(self) -> None:
        """Every shape once, within the deadline; raises ``WarmupFailure`` on the first failure."""
        try:
            async with asyncio.timeout(self.plan.deadline_s):
                model = await self._discover_model()
                for words, batch in self.plan.shapes():
                    await self._batch(model, self.fit(words), batch)
        except TimeoutError:
            raise WarmupFailure(
                "timeout", f"not done within the {self.plan.deadline_s:g}s deadline"
            ) from None

    def fit(self, words: int) -> int:
        """``words``, or fewer when that prompt and its answer would not fit the context."""
        if self.context is None:
            return words
        room = int((self.context - self.plan.max_tokens) * FIT_MARGIN / self.tokens_per_word)
        if words <= room:
            return words
        log_event(
            logger,
            logging.INFO,
            "warm-up prompt fitted to the engine's context",
            planned_words=words,
            words=max(room, 1),
            max_model_len=self.context,
        )
        return max(room, 1)

    async def _batch(self, model: str, words: int, batch: int) -> None:
        """One batch sent concurrently; the first failure cancels the rest.

        Not a TaskGroup: on Python 3.11 one that is cancelled while a request fails raises
        the failure and drops the cancellation, so a restart seen mid-round would leave the
        round retrying instead of stopping."""
        tasks = [asyncio.create_task(self._one(model, words)) for _ in range(batch)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            failure = None if task.cancelled() else task.exception()
            if failure is not None:
                raise failure

    async def _one(self, model: str, words: int) -> None:
        body = {
            "model": model,
            "prompt": prompt(words, self.sent),  # numbered: no two share a prefix
            "max_tokens": self.plan.max_tokens,
            "temperature": 0,
            "stream": False,
        }
        self.sent += 1
        outcome = "cancelled"  # cut short by the round's deadline or a failing neighbour
        try:
            answer = await self._post("/v1/completions", body)
            choices = answer.get("choices") if isinstance(answer, dict) else None
            if not isinstance(choices, list) or not choices:
                raise WarmupFailure("invalid", "the answer has no choices")
            self._count_tokens(answer.get("usage"), words)
            outcome = "ok"
        except WarmupFailure as failure:
            outcome = failure.outcome
            raise
        finally:
            self.outcomes[outcome] += 1

    def _count_tokens(self, usage: Any, words: int) -> None:
        """The answer's usage, so that reconciliation knows this traffic (see tenancy), and
        the tokens per word its prompt took (the most seen: fitting errs short)."""
        if not isinstance(usage, dict):
            return
        for token_type in ("prompt", "completion"):
            n = usage.get(f"{token_type}_tokens")
            if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_USAGE_TOKENS:
                self.tokens[token_type] += n
                if token_type == "prompt":
                    self.tokens_per_word = max(self.tokens_per_word, n / words)

    async def _discover_model(self) -> str:
        """The model to warm up (``--model``, else the engine's first) and its context."""
        try:
            listing = await self._get("/v1/models")
        except WarmupFailure:
            if self.model is None:
                raise
            return self.model  # a model is given: warm up without knowing the context
        data = listing.get("data") if isinstance(listing, dict) else None
        entries = [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []
        served = next((e for e in entries if e.get("id") == self.model), None)
        if self.model is None and entries and entries[0].get("id"):
            served = entries[0]
            self.model = str(served["id"])
        if self.model is None:
            raise WarmupFailure("invalid", "GET /v1/models lists no model; set --model")
        context = served.get("max_model_len") if served else None
        valid = isinstance(context, int) and not isinstance(context, bool) and context > 0
        self.context = context if valid else None
        return self.model

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        return await self._request("POST", path, body)

    async def _get(self, path: str) -> Any:
        return await self._request("GET", path, None)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        try:
            async with self.http.stream(
                method, self.base_url + path, json=body, timeout=self.plan.deadline_s
            ) as response:
                if response.status_code != 200:
                    said = await error_message(response)
                    raise WarmupFailure(
                        "http_status",
                        f"{method} {path} answered HTTP {response.status_code}"
                        + (f": {said}" if said else ""),
                    )
                raw = await read_bounded(response, MAX_RESPONSE_BYTES)
        except ScrapeFailure as failure:  # over the size cap, or an encoding we cannot undo
            raise WarmupFailure(failure.reason, f"{method} {path}: {failure.detail}") from None
        except httpx.TimeoutException:
            raise WarmupFailure("timeout", f"{method} {path} timed out") from None
        except httpx.HTTPError as exc:
            raise WarmupFailure("connect", f"{method} {path}: {type(exc).__name__}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise WarmupFailure("invalid", f"{method} {path} answered no JSON") from None

    # ---- what the sidecar serves ---------------------------------------------------------------

    def readiness(self) -> Sequence[Condition]:
        return [self.state]

    def families(self) -> list[Metric]:
        cat = catalog.load()
        requests = cat.family("warmup_requests")
        for outcome, count in sorted(self.outcomes.items()):
            requests.add_metric([outcome], count)
        tokens = cat.family("warmup_tokens")
        for token_type in ("prompt", "completion"):
            tokens.add_metric([token_type], self.tokens[token_type], created=self.tokens_since)
        return [requests, tokens]

    async def aclose(self) -> None:
        await self.http.aclose()
