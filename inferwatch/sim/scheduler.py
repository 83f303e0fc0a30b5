"""Request scheduling over the paged KV cache: continuous batching (vLLM V1) or static batches.

Continuous: every step first advances the running requests (decode, or the next prefill chunk)
within the token budget, preempting the most recently admitted request when blocks run out
(recompute: its blocks are freed and it goes back to the front of the queue), then admits
waiting requests in arrival order while blocks, sequence slots and budget allow, reusing cached
prefix blocks. Static: a batch is admitted only when the previous one has fully finished, with
blocks for prompt plus max_tokens reserved up front, so a long request holds everyone behind it.

The scheduler is synchronous and clock-free: :meth:`Scheduler.schedule` plans a step,
:meth:`Scheduler.complete` applies it once the step's time has passed.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferwatch.sim.kvcache import BlockPool, block_hashes


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One sequence: its prompt, the output it will produce, and its progress."""

    id: str
    prompt: Sequence[str]
    planned: Sequence[str]  # output pieces in order; generation stops after the last
    finish_reason: str  # when all planned pieces are out: "stop" or "length"
    max_tokens: int
    arrival: float = 0.0
    status: Status = Status.WAITING
    output: list[str] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is in the cache
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # of this request's full blocks
    lookup: list[int] = field(default_factory=list)  # prefix hashes tried at admission
    cached_tokens: int = 0  # prefix-cache hit at first admission
    preemptions: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    def tokens(self, start: int, end: int) -> list[str]:
        """Tokens ``start`` .. ``end - 1`` of prompt followed by output."""
        prompt_len = len(self.prompt)
        head = list(self.prompt[start:end])
        return head + self.output[max(0, start - prompt_len) : max(0, end - prompt_len)]


@dataclass(frozen=True)
class Scheduled:
    request: Request
    new_tokens: int
    context: int  # tokens in the KV cache after the step


@dataclass
class StepPlan:
    scheduled: list[Scheduled] = field(default_factory=list)
    admitted: list[tuple[Request, int]] = field(default_factory=list)  # (request, cached tokens)
    preempted: list[Request] = field(default_factory=list)
    idle_sequences: int = 0  # static batching: finished sequences still padded in the batch

    @property
    def num_tokens(self) -> int:
        return sum(item.new_tokens for item in self.scheduled)


@dataclass(frozen=True)
class Emitted:
    """One token out of a step; ``first`` for the token that ends a request's prefill."""

    request: Request
    piece: str
    first: bool
    finished: bool


class Scheduler:
    def __init__(
        self, pool: BlockPool, max_num_seqs: int, max_num_batched_tokens: int, static: bool = False
    ) -> None:
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.static = static
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._batch_size = 0  # static batching: size of the batch in flight

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    def abort(self, request: Request) -> bool:
        """Drop a request wherever it is; False if it had already finished."""
        if request.status is Status.FINISHED:
            return False
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._finish(request)
        return True

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.pool.block_size)

    def _finish(self, request: Request) -> None:
        request.status = Status.FINISHED
        self.pool.release(request.blocks)
        request.blocks = []

    def _preempt(self, request: Request) -> None:
        self.pool.release(request.blocks)
        request.blocks = []
        request.num_computed = 0
        request.preemptions += 1
        request.status = Status.WAITING
        self.waiting.appendleft(request)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        for request in list(self.running):
            if budget == 0 or request not in self.running:
                break
            count = min(request.num_tokens - request.num_computed, budget)
            extra = self._blocks_for(request.num_computed + count) - len(request.blocks)
            while extra > self.pool.num_free and not self.static:
                victim = self.running.pop()
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is request:
                    break
            if request.status is not Status.RUNNING:
                break
            request.blocks += self.pool.allocate(extra) or []
            plan.scheduled.append(Scheduled(request, count, request.num_computed + count))
            budget -= count
        if self.static:
            plan.idle_sequences = max(0, self._batch_size - len(self.running))
            if self.running:
                return plan
            self._batch_size = 0
        if not plan.preempted:
            budget = self._admit(plan, budget)
        if self.static:
            self._batch_size = len(self.running)
        return plan

    def _admit(self, plan: StepPlan, budget: int) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            # The last token is always computed, so at most (tokens - 1) come from the cache.
            full = (request.num_tokens - 1) // self.pool.block_size
            size = self.pool.block_size
            if len(request.lookup) != full:  # computed once per (re)admission, not per step
                request.lookup = block_hashes(request.tokens(0, full * size), size)
            hashes = request.lookup
            cached = self.pool.cached_prefix(hashes)
            cached_tokens = len(cached) * self.pool.block_size
            count = min(request.num_tokens - cached_tokens, budget)
            reserve = request.num_tokens - len(request.output) + request.max_tokens
            target = reserve if self.static else cached_tokens + count
            extra = self._blocks_for(target) - len(cached)
            if extra > self.pool.num_free - self.pool.idle_among(cached):
                break
            self.pool.take(cached)
            request.blocks = cached + (self.pool.allocate(extra) or [])
            request.hashes = hashes[: len(cached)]
            request.num_computed = cached_tokens
            if not request.output and not request.preemptions:
                request.cached_tokens = cached_tokens
            request.status = Status.RUNNING
            self.waiting.popleft()
            self.running.append(request)
            plan.admitted.append((request, cached_tokens))
            plan.scheduled.append(Scheduled(request, count, cached_tokens + count))
            budget -= count
        return budget

    def complete(self, plan: StepPlan) -> list[Emitted]:
        """Apply a planned step: KV written, one token sampled for each finished prefill."""
        emitted: list[Emitted] = []
        for item in plan.scheduled:
            request = item.request
            if request.status is not Status.RUNNING:
                continue  # aborted or preempted while the step ran
            request.num_computed = item.context
            self._register_full_blocks(request)
            if request.num_computed < request.num_tokens:
                continue  # a prefill chunk; more to come
            first = not request.output
            piece = request.planned[len(request.output)]
            request.output.append(piece)
            finished = len(request.output) == len(request.planned)
            if finished:
                self.running.remove(request)
                self._finish(request)
            emitted.append(Emitted(request, piece, first, finished))
        return emitted

    def _register_full_blocks(self, request: Request) -> None:
        full = request.num_computed // self.pool.block_size
        start = len(request.hashes)
        if full <= start:
            return
        size = self.pool.block_size
        parent = request.hashes[-1] if request.hashes else None
        new = block_hashes(request.tokens(start * size, full * size), size, parent)
        for index, value in enumerate(new, start):
            self.pool.register(request.blocks[index], value)
        request.hashes += new
