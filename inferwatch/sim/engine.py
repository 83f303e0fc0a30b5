"""One engine rank: a single asyncio task that steps the scheduler at roofline speed.

Time is simulated seconds: wall time multiplied by the speed factor, so a demo at ``speed=10``
shows realistic latencies in its metrics while running ten times faster. The task sleeps while
there is nothing to do (no polling) and is woken by new requests, aborts and fault changes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from inferwatch.capacity.planner import Capacity
from inferwatch.capacity.roofline import Roofline
from inferwatch.sim.coldstart import GraphCache
from inferwatch.sim.faults import Faults
from inferwatch.sim.gpu import SimulatedGPU
from inferwatch.sim.kvcache import BlockPool
from inferwatch.sim.metrics import FinishedRequest, RankMetrics
from inferwatch.sim.scheduler import Emitted, Request, Scheduler, StepPlan
from inferwatch.sim.specdecode import Drafter


class SimClock:
    """Simulated seconds since start: wall time x speed."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._start = time.monotonic()

    def now(self) -> float:
        return self.at(time.monotonic())

    def at(self, wall: float) -> float:
        """The simulated time of a ``time.monotonic()`` reading."""
        return (wall - self._start) * self.speed

    async def sleep_until(self, wall: float) -> None:
        await asyncio.sleep(max(0.0, wall - time.monotonic()))


# Back-to-back steps are laid end to end on the simulated timeline, so the host's own
# per-step overhead does not inflate simulated latencies, unless the engine falls this far
# (wall seconds) behind, when it resynchronises with the wall clock.
MAX_LAG_S = 0.05


@dataclass(frozen=True)
class Finished:
    """The end of a request's stream (after its last token, or instead of more)."""

    reason: str  # stop | length | abort | error


Event = Emitted | Finished


class Engine:
    def __init__(
        self,
        rank: int,
        capacity: Capacity,
        num_blocks: int,
        *,
        static_batching: bool,
        enable_prefix_caching: bool,
        metrics: RankMetrics,
        gpus: list[SimulatedGPU],
        clock: SimClock,
        graphs: GraphCache | None = None,
        drafter: Drafter | None = None,
    ) -> None:
        self.rank = rank
        self.drafter = drafter
        self.graphs = graphs or GraphCache(0.0)
        self.pool = BlockPool(num_blocks, capacity.block_size, enable_prefix_caching)
        self.scheduler = Scheduler(
            self.pool, capacity.max_num_seqs, capacity.max_num_batched_tokens, static_batching
        )
        self.roofline = Roofline(capacity)
        self.metrics = metrics
        self.gpus = gpus
        self.clock = clock
        self.faults = Faults()
        self.dead = False
        self._budget = capacity.max_num_batched_tokens
        self._streams: dict[Request, asyncio.Queue[Event]] = {}
        self._wake = asyncio.Event()
        self.metrics.kv_usage.set(0.0)

    @property
    def load(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    def submit(self, request: Request) -> asyncio.Queue[Event]:
        request.arrival = self.clock.now()
        stream: asyncio.Queue[Event] = asyncio.Queue()
        self._streams[request] = stream
        self.scheduler.add(request)
        self.metrics.waiting.set(len(self.scheduler.waiting))
        self._wake.set()
        return stream

    def abort(self, request: Request, reason: str = "abort") -> None:
        """Stop a request (client gone, engine dead); its stream ends with ``reason``."""
        stream = self._streams.pop(request, None)
        if stream is None or not self.scheduler.abort(request):
            return
        self.metrics.success[reason].inc()
        stream.put_nowait(Finished(reason))
        self._wake.set()

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        self.pool.withheld = int(faults.kv_exhaustion * self.pool.num_blocks)
        self._publish(0)
        self._wake.set()

    def kill(self) -> None:
        """The GPU is gone: every request fails, nothing more is scheduled."""
        self.dead = True
        for request in list(self._streams):
            self.abort(request, "error")

    def revive(self) -> None:
        self.dead = False
        self._wake.set()

    async def run(self) -> None:
        step_end: float | None = None  # wall time the previous step ended, if back to back
        while True:
            self._wake.clear()
            if self.dead or self.faults.hang or not self.scheduler.has_work:
                step_end = None
                await self._wake.wait()
                continue
            plan = self.scheduler.schedule()
            if not plan.scheduled:  # blocked on KV blocks until something frees them
                self._publish(0)
                step_end = None
                await self._wake.wait()
                continue
            wall = time.monotonic()
            begin = wall if step_end is None else max(step_end, wall - MAX_LAG_S)
            start = self.clock.at(begin)
            for request, cached in plan.admitted:
                if request.scheduled_at is None:
                    request.scheduled_at = max(start, request.arrival)
                self.metrics.admitted(request.num_tokens, cached)
            if plan.preempted:
                self.metrics.preemptions.inc(len(plan.preempted))
            items = [(item.new_tokens, item.context) for item in plan.scheduled]
            if plan.idle_sequences:  # static batching pads finished sequences
                longest = max(context for _, context in items)
                items += [(1, longest)] * plan.idle_sequences
            cost = self.roofline.step(items)
            seconds = cost.seconds * self.faults.slow_factor + self.graphs.penalty(len(items))
            step_end = begin + seconds / self.clock.speed
            await self.clock.sleep_until(step_end)
            end = self.clock.at(step_end)
            for gpu in self.gpus:
                gpu.record_step(start, end, cost.compute_share, plan.num_tokens / self._budget)
            if self.drafter is not None:
                self._speculate(plan)
            for emitted in self.scheduler.complete(plan):
                self._deliver(emitted, end)
            self._publish(plan.num_tokens)

    def _speculate(self, plan: StepPlan) -> None:
        """Draft for every request this step decodes (those past their prefill)."""
        assert self.drafter is not None
        decoding = sum(1 for item in plan.scheduled if item.request.output)
        if decoding:
            fill = len(plan.scheduled) / self.scheduler.max_num_seqs
            self.metrics.speculated(self.drafter.step(decoding, fill))

    def _publish(self, step_tokens: int) -> None:
        if step_tokens:
            self.metrics.h["iteration_tokens"].observe(step_tokens)
        waiting = len(self.scheduler.waiting)
        self.metrics.running.set(len(self.scheduler.running))
        self.metrics.waiting.set(waiting)
        self.metrics.waiting_capacity.set(waiting)
        self.metrics.kv_usage.set(self.pool.usage)

    def _deliver(self, emitted: Emitted, now: float) -> None:
        request = emitted.request
        if emitted.first:
            request.first_token_at = now
            self.metrics.first_token(
                len(request.prompt), request.cached_tokens, now - request.arrival
            )
        else:
            self.metrics.next_token(now - (request.last_token_at or now))
        request.last_token_at = now
        stream = self._streams.get(request)
        if stream is not None:
            stream.put_nowait(emitted)
        if not emitted.finished:
            return
        self._streams.pop(request, None)
        scheduled = request.scheduled_at if request.scheduled_at is not None else now
        first = request.first_token_at if request.first_token_at is not None else now
        self.metrics.finished(
            FinishedRequest(
                finished_reason=request.finish_reason,
                prompt_tokens=len(request.prompt),
                generation_tokens=len(request.output),
                max_tokens=request.max_tokens,
                e2e=max(0.0, now - request.arrival),
                queue=max(0.0, scheduled - request.arrival),
                prefill=first - scheduled,
                decode=now - first,
                inference=now - scheduled,
                preemptions=request.preemptions,
            )
        )
        if stream is not None:
            stream.put_nowait(Finished(request.finish_reason))

    def close(self) -> None:
        """End every open stream (server shutdown)."""
        for request in list(self._streams):
            self.abort(request)
