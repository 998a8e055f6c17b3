"""The scheduler batches, chunks, preempts and speculates the way vLLM V1's scheduler does."""

from __future__ import annotations

from app.sim.kv_cache import BLOCK_SIZE, BlockPool
from app.sim.request import SimRequest, Status
from app.sim.scheduler import Scheduled, Scheduler, SchedulerConfig


def _token_at(req: SimRequest, k: int) -> int:
    return 5 + k % 7


def _req(rid: str, n_prompt: int, max_tokens: int, *, start: int = 0, eos_at: int | None = None,
         priority: int = 0, seq: int = 0) -> SimRequest:
    return SimRequest(rid, list(range(start, start + n_prompt)), max_tokens=max_tokens, eos_at=eos_at,
                      priority=priority, seq=seq, arrival=float(seq))


def _step(s: Scheduler, t: float = 0.0) -> tuple[list[Scheduled], list[tuple[SimRequest, int]]]:
    batch = s.schedule(t)
    produced, _ = s.finish_step(batch, _token_at, t)
    return batch, produced


def _drain(s: Scheduler, limit: int = 10_000) -> list[list[Scheduled]]:
    steps = []
    while s.has_work() and len(steps) < limit:
        steps.append(_step(s)[0])
    assert not s.has_work()
    return steps


def test_batch_never_exceeds_max_num_seqs() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=4096), BlockPool(200))
    reqs = [_req(f"r{i}", 20, 5, start=1000 * i, seq=i) for i in range(10)]
    for r in reqs:
        s.add(r)
    steps = _drain(s)
    assert max(len(b) for b in steps) == 3
    assert all(r.num_output == 5 for r in reqs)


def test_token_budget_chunks_long_prefills() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), BlockPool(200))
    long, short = _req("long", 100, 4, seq=0), _req("short", 10, 4, start=5000, seq=1)
    s.add(long)
    s.add(short)
    first, produced = _step(s)
    assert [(x.req.rid, x.num_new) for x in first] == [("long", 64)]
    assert produced == []  # a partial prefill samples nothing
    second, produced = _step(s)
    assert [(x.req.rid, x.num_new) for x in second] == [("long", 36), ("short", 10)]
    assert {r.rid for r, _ in produced} == {"long", "short"}
    for batch in _drain(s):
        assert sum(x.num_new for x in batch) <= 64


def test_second_identical_prompt_hits_all_full_blocks_but_the_last_token() -> None:
    s = Scheduler(SchedulerConfig(), BlockPool(100))
    a, b = _req("a", 3 * BLOCK_SIZE, 2, seq=0), _req("b", 3 * BLOCK_SIZE, 2, seq=1)
    s.add(a)
    _drain(s)
    s.add(b)
    _drain(s)
    assert a.cached_tokens == 0
    assert b.cached_tokens == 2 * BLOCK_SIZE  # capped at n-1 tokens: the third full block is recomputed
    assert s.counters.prefix_queries == 6 * BLOCK_SIZE
    assert s.counters.prefix_hits == 2 * BLOCK_SIZE


def test_generated_tokens_fill_cacheable_blocks() -> None:
    s = Scheduler(SchedulerConfig(), BlockPool(100))
    a = _req("a", BLOCK_SIZE, 2 * BLOCK_SIZE + 1, seq=0)
    s.add(a)
    _drain(s)
    follow_up = SimRequest("b", [*a.tokens, 1, 2, 3], max_tokens=1, seq=1)  # next turn appends to the reply
    s.add(follow_up)
    _drain(s)
    assert follow_up.cached_tokens == 3 * BLOCK_SIZE


def test_out_of_blocks_preempts_the_latest_running_request_and_everyone_still_finishes() -> None:
    # 6 blocks; two requests that each grow to 3 blocks and a bit: one must be preempted.
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=1024), BlockPool(6))
    first, second = _req("first", 40, 20, seq=0), _req("second", 40, 20, start=500, seq=1)
    s.add(first)
    s.add(second)
    preempted_rids = []
    while s.has_work():
        before = s.counters.preemptions
        running = [r.rid for r in s.running]
        _step(s)
        if s.counters.preemptions > before:
            preempted_rids.append([r for r in running if r not in {x.rid for x in s.running}])
    assert s.counters.preemptions >= 1
    assert preempted_rids[0] == ["second"]
    assert first.num_output == 20 and second.num_output == 20
    assert second.num_preemptions >= 1
    assert s.pool.num_free == 6


def test_priority_policy_admits_lower_value_first_and_preempts_the_lowest_priority() -> None:
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=1024, policy="priority")
    s = Scheduler(cfg, BlockPool(50))
    late_urgent = _req("urgent", 10, 1, start=100, priority=-5, seq=2)
    s.add(_req("bulk", 10, 1, priority=3, seq=1))
    s.add(late_urgent)
    batch, _ = _step(s)
    assert [x.req.rid for x in batch] == ["urgent"]

    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=1024, policy="priority"), BlockPool(6))
    hi, lo = _req("hi", 40, 20, priority=0, seq=1), _req("lo", 40, 20, start=500, priority=9, seq=0)
    s.add(lo)
    s.add(hi)
    while s.counters.preemptions == 0 and s.has_work():
        _step(s)
    assert lo.num_preemptions == 1 and hi.num_preemptions == 0


def test_ignore_eos_generates_exactly_max_tokens_and_eos_stops_early() -> None:
    s = Scheduler(SchedulerConfig(), BlockPool(100))
    exact, stops = _req("exact", 30, 37, seq=0), _req("stops", 30, 37, start=99, eos_at=5, seq=1)
    s.add(exact)
    s.add(stops)
    _drain(s)
    assert (exact.num_output, exact.finish_reason) == (37, "length")
    assert (stops.num_output, stops.finish_reason) == (6, "stop")  # the EOS token counts as generated


def test_spec_decode_emits_one_to_k_plus_one_tokens_per_step_and_counters_add_up() -> None:
    k = 3
    s = Scheduler(SchedulerConfig(num_spec_tokens=k, spec_accept=0.6), BlockPool(400), seed=7)
    reqs = [_req(f"r{i}", 20, 200, start=1000 * i, seq=i) for i in range(4)]
    for r in reqs:
        s.add(r)
    per_step: list[int] = []
    while s.has_work():
        batch = s.schedule(0.0)
        drafted = {id(x.req): x.num_draft for x in batch}
        produced, _ = s.finish_step(batch, _token_at, 0.0)
        for r, n in produced:
            if drafted[id(r)]:
                assert 1 <= n <= drafted[id(r)] + 1
                per_step.append(n)
    c = s.counters
    assert set(per_step) <= set(range(1, k + 2)) and len(set(per_step)) > 1
    assert all(r.num_output == 200 for r in reqs)
    assert c.spec_draft_tokens <= k * c.spec_drafts
    assert sum(c.spec_accepted_per_pos) == c.spec_accepted
    assert c.spec_accepted_per_pos == sorted(c.spec_accepted_per_pos, reverse=True)
    # Every accepted draft is one token the step gave beyond its one sampled token (last steps may be clipped).
    assert sum(n - 1 for n in per_step) <= c.spec_accepted
    assert 0.3 < c.spec_accepted / c.spec_draft_tokens < 0.7


def test_abort_frees_blocks_and_leaves_the_queues() -> None:
    s = Scheduler(SchedulerConfig(), BlockPool(20))
    running, waiting = _req("run", 40, 100, seq=0), _req("wait", 40, 100, start=70, seq=1)
    s.add(running)
    _step(s)
    s.add(waiting)
    s.abort(running)
    s.abort(waiting)
    assert running.status is Status.FINISHED and running.finish_reason == "abort"
    assert not s.has_work()
    assert s.pool.num_free == 20


def test_blocks_are_findable_from_the_step_that_computes_them() -> None:
    # vLLM caches blocks at allocation: a twin admitted in the same step already hits them.
    s = Scheduler(SchedulerConfig(), BlockPool(100))
    a, b = _req("a", 3 * BLOCK_SIZE + 5, 2, seq=0), _req("b", 3 * BLOCK_SIZE + 5, 2, seq=1)
    s.add(a)
    s.add(b)
    batch, _ = _step(s)
    assert [x.req.rid for x in batch] == ["a", "b"]
    assert (a.cached_tokens, b.cached_tokens) == (0, 3 * BLOCK_SIZE)


def test_draft_probability_limits_how_often_a_sequence_speculates() -> None:
    cfg = SchedulerConfig(num_spec_tokens=3, spec_accept=0.5, spec_draft_prob=0.2)
    s = Scheduler(cfg, BlockPool(400), seed=3)
    r = _req("r", 20, 400)
    s.add(r)
    decode_steps = 0
    while s.has_work():
        batch, _ = _step(s)
        decode_steps += sum(1 for x in batch if x.num_new - x.num_draft == 1)
    share = s.counters.spec_drafts / decode_steps
    assert 0.1 < share < 0.3
