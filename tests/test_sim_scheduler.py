"""Scheduler, KV cache and roofline invariants of the simulator."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.capacity import planner as cap
from inferwatch.capacity.roofline import Roofline
from inferwatch.sim.kvcache import BlockPool
from inferwatch.sim.scheduler import Request, Scheduler, Status

pytestmark = pytest.mark.unit

BLOCK = 4


def make_request(index: int, prompt_len: int, output_len: int, prefix: int = 0) -> Request:
    shared = [f"p{prefix}-{i}" for i in range(prompt_len // 2)] if prefix else []
    own = [f"r{index}-{i}" for i in range(prompt_len - len(shared))]
    planned = [f" t{index}-{i}" for i in range(output_len)]
    return Request(f"r{index}", shared + own, planned, "length", max_tokens=output_len)


def run_to_completion(scheduler: Scheduler, arrivals: dict[int, list[Request]], steps: int):
    """Step until idle; check the block bookkeeping after every plan and every step."""
    emitted: dict[str, list[str]] = defaultdict(list)
    firsts: dict[str, int] = defaultdict(int)
    step = 0
    while step < steps and (scheduler.has_work or any(k >= step for k in arrivals)):
        for request in arrivals.get(step, []):
            scheduler.add(request)
        plan = scheduler.schedule()
        scheduler.pool.check(r.blocks for r in scheduler.running)
        for item in plan.scheduled:
            assert item.request.status is Status.RUNNING
            assert len(item.request.blocks) * BLOCK >= item.context  # room for what it computes
        assert plan.num_tokens <= scheduler.max_num_batched_tokens
        assert len(scheduler.running) <= scheduler.max_num_seqs
        for out in scheduler.complete(plan):
            emitted[out.request.id].append(out.piece)
            firsts[out.request.id] += out.first
        scheduler.pool.check(r.blocks for r in scheduler.running)
        step += 1
    return emitted, firsts, step


request_specs = st.lists(
    st.tuples(
        st.integers(0, 30),  # arrival step
        st.integers(1, 40),  # prompt tokens
        st.integers(1, 30),  # output tokens
        st.integers(0, 2),  # shared prefix group (0: none)
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(specs=request_specs, num_blocks=st.integers(18, 40), static=st.booleans(),
       caching=st.booleans())  # fmt: skip
def test_every_request_finishes_with_each_token_once(
    specs: list[tuple[int, int, int, int]], num_blocks: int, static: bool, caching: bool
) -> None:
    pool = BlockPool(num_blocks, BLOCK, enable_prefix_caching=caching)
    scheduler = Scheduler(pool, max_num_seqs=4, max_num_batched_tokens=32, static=static)
    arrivals: dict[int, list[Request]] = defaultdict(list)
    requests = []
    for index, (at, prompt, output, prefix) in enumerate(specs):
        request = make_request(index, prompt, output, prefix)
        arrivals[at].append(request)
        requests.append(request)
    emitted, firsts, _ = run_to_completion(scheduler, arrivals, steps=5000)
    assert not scheduler.has_work
    for request in requests:
        assert request.status is Status.FINISHED
        assert emitted[request.id] == list(request.planned)  # in order, none twice, none lost
        assert firsts[request.id] == 1
        assert request.blocks == []
        if static:
            assert request.preemptions == 0
    assert pool.num_free == num_blocks  # every block came back


def test_preempted_requests_resume_and_finish() -> None:
    pool = BlockPool(10, BLOCK)  # 40 tokens: three 12-token requests cannot all grow to 24
    scheduler = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=64)
    requests = [make_request(i, 12, 12) for i in range(3)]
    emitted, _, _ = run_to_completion(scheduler, {0: requests}, steps=1000)
    assert sum(r.preemptions for r in requests) > 0
    assert all(emitted[r.id] == list(r.planned) for r in requests)


def test_shared_prefix_blocks_are_reused() -> None:
    pool = BlockPool(64, BLOCK)
    scheduler = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=256)
    first, second = make_request(1, 40, 2, prefix=7), make_request(2, 40, 2, prefix=7)
    run_to_completion(scheduler, {0: [first], 5: [second]}, steps=100)
    assert first.cached_tokens == 0
    assert second.cached_tokens == 20  # the 20 shared tokens = 5 full blocks


def test_prefix_cache_hit_never_covers_the_whole_prompt() -> None:
    pool = BlockPool(64, BLOCK)
    scheduler = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=256)
    one = Request("a", [str(i) for i in range(16)], ["x"], "length", 1)
    again = Request("b", [str(i) for i in range(16)], ["x"], "length", 1)
    run_to_completion(scheduler, {0: [one], 3: [again]}, steps=50)
    assert again.cached_tokens == 12  # the last token is always computed


def admission_steps(static: bool) -> dict[str, int]:
    """The step each of three requests is admitted at, two slots, r0 long and r1, r2 short:
    the batching tests differ only in whether batching is static."""
    pool = BlockPool(100, BLOCK)
    scheduler = Scheduler(pool, max_num_seqs=2, max_num_batched_tokens=256, static=static)
    for request in (make_request(0, 4, 30), make_request(1, 4, 2), make_request(2, 4, 2)):
        scheduler.add(request)
    admitted_at: dict[str, int] = {}
    for step in range(40):
        plan = scheduler.schedule()
        for request, _ in plan.admitted:
            admitted_at[request.id] = step
        scheduler.complete(plan)
    return admitted_at


def test_static_batching_blocks_the_queue_until_the_batch_ends() -> None:
    admitted_at = admission_steps(static=True)
    assert admitted_at["r0"] == admitted_at["r1"] == 0
    # r1 finished at step 2, but r2 waits for r0's 30 tokens
    assert admitted_at["r2"] >= 30


def test_continuous_batching_admits_as_soon_as_a_slot_frees() -> None:
    assert admission_steps(static=False)["r2"] <= 3


def test_withheld_blocks_stop_admission() -> None:
    pool = BlockPool(10, BLOCK)
    pool.withheld = 9
    scheduler = Scheduler(pool, max_num_seqs=4, max_num_batched_tokens=64)
    scheduler.add(make_request(0, 12, 2))  # needs 3 blocks, 1 usable
    assert scheduler.schedule().scheduled == []
    assert pool.usage == 0.9
    pool.withheld = 0
    assert scheduler.schedule().scheduled[0].new_tokens == 12


def test_aborted_requests_return_their_blocks() -> None:
    pool = BlockPool(20, BLOCK)
    scheduler = Scheduler(pool, max_num_seqs=4, max_num_batched_tokens=64)
    running, waiting = make_request(0, 20, 5), make_request(1, 20, 5)
    scheduler.add(running)
    scheduler.complete(scheduler.schedule())
    scheduler.add(waiting)
    assert scheduler.abort(running) and scheduler.abort(waiting)
    assert not scheduler.abort(running)
    assert pool.num_free == 20
    pool.check([])


LLAMA_8B_H100 = cap.compute(
    cap.model_preset("llama-3.1-8b"), cap.gpu_preset("H100"), cap.ServingSpec(max_model_len=8192)
)


def test_decode_is_memory_bound_and_amortised_over_the_batch() -> None:
    roofline = Roofline(LLAMA_8B_H100)
    one = roofline.step([(1, 512)])
    batch = roofline.step([(1, 512)] * 64)
    assert one.compute_share < 0.05
    # weights dominate: 64 sequences cost far less than 64 single steps
    assert batch.seconds < 2 * one.seconds
    weights_s = LLAMA_8B_H100.weight_bytes / (LLAMA_8B_H100.gpu.bandwidth * 0.8)
    assert weights_s < one.seconds < weights_s + 0.003


def test_prefill_is_compute_bound_and_linear_in_tokens() -> None:
    roofline = Roofline(LLAMA_8B_H100)
    small, large = roofline.step([(2048, 2048)]), roofline.step([(8192, 8192)])
    assert large.compute_share > 0.8
    assert 3.5 < large.seconds / small.seconds < 6  # 4x the tokens plus attention's quadratic part


def test_faster_gpu_decodes_faster() -> None:
    serving = cap.ServingSpec(max_model_len=8192)
    model = cap.model_preset("llama-3.1-8b")
    h200 = Roofline(cap.compute(model, cap.gpu_preset("H200"), serving)).step([(1, 100)])
    l4 = Roofline(cap.compute(model, cap.gpu_preset("L4"), serving)).step([(1, 100)])
    assert h200.seconds * 5 < l4.seconds  # 4.8 TB/s against 0.3 TB/s


def test_moe_decode_reads_only_touched_experts() -> None:
    mixtral = cap.compute(
        cap.model_preset("mixtral-8x7b"),
        cap.gpu_preset("H200"),
        cap.ServingSpec(max_model_len=8192),
    )
    roofline = Roofline(mixtral)
    full_weights_s = mixtral.weight_bytes / (mixtral.gpu.bandwidth * 0.8)
    assert roofline.step([(1, 100)]).seconds < 0.5 * full_weights_s
    assert roofline.step([(1, 100)] * 64).seconds > full_weights_s
