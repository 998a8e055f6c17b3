import asyncio
import random

import pytest

from app.admission.fast import FastTicket
from app.admission.queue import AdmissionQueue, AdmissionRejected, Ticket
from app.config.admission import AdmissionConfig
from tests.admission.fakes import FakeClock, FakeReplica

CFG = AdmissionConfig(enabled=True, max_waiting_per_replica=4)
SATURATED = [FakeReplica(waiting=4, running=8)]  # 4 queued in the engine: the cap is 4 below what is in flight
IDLE = [FakeReplica()]


def saturated_queue(held: int, cfg: AdmissionConfig = CFG, **kw: object) -> tuple[AdmissionQueue, list[Ticket]]:
    """A queue with `held` tickets in flight and a scrape saying the pool is saturated: the cap is `held`."""
    q = AdmissionQueue(cfg, **kw)  # type: ignore[arg-type]
    tickets = [q.try_admit("warm", "bulk", 10) for _ in range(held + 4)]
    assert all(t is not None for t in tickets)
    assert q.on_state_change(SATURATED).saturated
    assert q.limit == held and q.capacity == 8
    for t in tickets[held:]:
        t.release()  # type: ignore[union-attr]
    return q, [t for t in tickets[:held] if t is not None]


async def settle_loop() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_below_saturation_admit_does_not_suspend() -> None:
    q = AdmissionQueue(CFG)
    q.on_state_change(IDLE)
    enter = q.admit("a", "interactive", 100).__aenter__()
    with pytest.raises(StopIteration) as done:
        enter.send(None)  # a coroutine that never suspends finishes on its first step
    ticket = done.value.value
    assert isinstance(ticket, Ticket) and not ticket.queued and ticket.waited_s == 0.0
    assert q.in_flight == 1 and q.limit is None


async def test_disabled_queue_always_admits_at_once() -> None:
    q = AdmissionQueue(AdmissionConfig(enabled=False))
    q.on_state_change([FakeReplica(waiting=100)])
    tickets = [q.try_admit("a", "bulk", 1) for _ in range(10)]
    assert all(tickets) and q.limit is None and q.in_flight == 10


async def test_saturated_pool_queues_and_a_release_starts_the_next() -> None:
    q, held = saturated_queue(2)
    task = asyncio.create_task(q.acquire("a", "bulk", 50))
    await settle_loop()
    assert not task.done() and q.queue_lengths() == {"a": 1}
    held[0].release()
    ticket = await asyncio.wait_for(task, 1)
    assert ticket.queued and q.in_flight == 2 and q.queue_len == 0


async def test_release_order_is_fair_across_tenants() -> None:
    q, held = saturated_queue(1)
    order: list[str] = []

    async def one(tenant: str) -> None:
        async with q.admit(tenant, "bulk", 100):
            order.append(tenant)
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(one("heavy")) for _ in range(6)]
    await settle_loop()
    tasks += [asyncio.create_task(one("light")) for _ in range(2)]
    await settle_loop()
    held[0].release()
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    # light, lifted to heavy's counter (a tie, and its backlog is shorter), alternates with heavy instead of
    # waiting behind its 6.
    assert order[:5] == ["light", "heavy", "light", "heavy", "heavy"]
    assert q.in_flight == 0


async def test_interactive_requests_of_a_tenant_start_before_its_bulk_ones() -> None:
    q, held = saturated_queue(1)
    order: list[str] = []

    async def one(cls: str) -> None:
        async with q.admit("a", cls, 10):  # type: ignore[arg-type]
            order.append(cls)
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(one("bulk")) for _ in range(2)] + [asyncio.create_task(one("interactive"))]
    await settle_loop()
    held[0].release()
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order == ["interactive", "bulk", "bulk"]


async def test_a_request_that_cannot_start_by_its_deadline_is_rejected_and_leaves_the_queue() -> None:
    q, _ = saturated_queue(1)
    with pytest.raises(AdmissionRejected) as e:
        await q.acquire("a", "interactive", 10, deadline_s=0.02)
    assert e.value.reason == "deadline" and e.value.retry_after_s > 0 and e.value.route_class == "interactive"
    assert q.queue_len == 0 and q.rejected == {("a", "deadline"): 1}


async def test_the_class_deadline_from_the_config_applies() -> None:
    cfg = AdmissionConfig(enabled=True, deadline_s={"interactive": 0.02, "bulk": 5})
    q, _ = saturated_queue(1, cfg)
    bulk = asyncio.create_task(q.acquire("a", "bulk", 10))
    with pytest.raises(AdmissionRejected):
        await q.acquire("a", "interactive", 10)
    assert not bulk.done()
    bulk.cancel()


async def test_a_full_queue_refuses_the_tenant_with_the_longest_backlog() -> None:
    cfg = AdmissionConfig(enabled=True, max_queue_len=3)
    q, _ = saturated_queue(1, cfg)
    heavy = [asyncio.create_task(q.acquire("heavy", "bulk", 10)) for _ in range(3)]
    await settle_loop()
    with pytest.raises(AdmissionRejected) as own:
        await q.acquire("heavy", "bulk", 10)
    assert own.value.reason == "queue_full"
    light = asyncio.create_task(q.acquire("light", "bulk", 10))
    await settle_loop()
    # light took the place of heavy's newest request, which was refused.
    assert q.queue_lengths() == {"heavy": 2, "light": 1}
    with pytest.raises(AdmissionRejected) as evicted:
        await heavy[2]
    assert evicted.value.reason == "queue_full"
    for t in [*heavy[:2], light]:
        t.cancel()


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    q, held = saturated_queue(1)
    task = asyncio.create_task(q.acquire("gone", "bulk", 10))
    await settle_loop()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert q.queue_len == 0
    counter = q.counters().get("gone")
    held[0].release()
    assert q.in_flight == 0 and q.counters().get("gone") == counter


async def test_a_waiter_cancelled_just_after_its_grant_hands_the_slot_back() -> None:
    q, held = saturated_queue(1)
    task = asyncio.create_task(q.acquire("a", "bulk", 10))
    other = asyncio.create_task(q.acquire("b", "bulk", 10))
    await settle_loop()
    held[0].release()  # grants "a" (its task has not resumed yet) ...
    task.cancel()  # ... and the client goes away before it does
    with pytest.raises(asyncio.CancelledError):
        await task
    ticket = await asyncio.wait_for(other, 1)  # the slot went on to "b"
    assert q.in_flight == 1
    ticket.release()
    assert q.in_flight == 0


async def test_settle_corrects_the_charge_with_the_actual_tokens() -> None:
    q, held = saturated_queue(2)
    held[0].release()  # room under the cap, nobody waiting: granted at once, charged the prediction
    t = q.try_admit("a", "bulk", 1000)
    assert t is not None and not isinstance(t, FastTicket) and q.counters()["a"] == 1000
    t.settle(300)
    t.settle(5)  # once only
    t.release()
    t.release()  # idempotent
    assert q.served_tokens["a"] == 300 and q.counters()["a"] == 300 and q.in_flight == 1


async def test_below_saturation_a_start_counts_its_actual_tokens_and_charges_nothing_to_the_fair_order() -> None:
    # Nobody waits: a counter charged now would be lifted to the floor when its tenant next waits (VTC), so
    # the fast path skips the charge; the tenant's served tokens still get the actual cost at release.
    q = AdmissionQueue(CFG)
    t = q.try_admit("a", "bulk", 1000)
    assert isinstance(t, FastTicket) and not t.queued and t.waited_s == 0.0 and not t.over_share
    t.settle(300)
    t.settle(5)  # once only
    t.release()
    t.release()  # idempotent
    assert q.served_tokens == {"a": 300} and "a" not in q.counters() and q.in_flight == 0
    assert t.charged_tokens == 300


async def test_a_start_below_saturation_that_ends_while_others_wait_is_charged_to_the_fair_order() -> None:
    q, held = saturated_queue(1)  # held[0] started before the cap: a fast start of "warm"
    assert isinstance(held[0], FastTicket)
    task = asyncio.create_task(q.acquire("a", "bulk", 10))
    await settle_loop()
    held[0].release(40)  # its service now counts against what "a" waits for, and its slot goes to "a"
    ticket = await asyncio.wait_for(task, 1)
    assert ticket.queued and q.counters()["warm"] == 40 and q.served_tokens["warm"] == 4 * 10 + 40  # 4 released before


async def test_start_now_starts_only_below_saturation() -> None:
    q = AdmissionQueue(CFG)
    t = q.start_now("a", "interactive")
    assert isinstance(t, FastTicket) and q.in_flight == 1 and q.tenant_in_flight == {"a": 1}
    t.release()
    capped, _ = saturated_queue(1)
    assert capped.start_now("a", "interactive") is None and capped.in_flight == 1
    tokens_capped = AdmissionQueue(AdmissionConfig(enabled=True, max_in_flight_tokens=1000))
    assert tokens_capped.start_now("a", "interactive") is None  # the token cap needs each start's prediction


async def test_a_scrape_with_room_again_fills_the_free_slots_and_then_lifts_the_cap() -> None:
    q, held = saturated_queue(2)
    waiters = [asyncio.create_task(q.acquire("a", "bulk", 10)) for _ in range(6)]
    await settle_loop()
    q.on_state_change([FakeReplica(waiting=0, running=4)])  # capacity 8: 4 free slots
    assert q.limit == 2 + 4
    await settle_loop()
    assert sum(t.done() for t in waiters) == 4
    q.on_state_change([FakeReplica(waiting=0, running=4)])
    await settle_loop()
    assert all(t.done() for t in waiters) and q.queue_len == 0
    q.on_state_change([FakeReplica(waiting=0)])
    assert q.limit is None
    for t in [*held, *(w.result() for w in waiters)]:
        t.release()


async def test_engine_queue_lowers_the_cap_below_what_is_in_flight() -> None:
    q = AdmissionQueue(CFG)
    held = [q.try_admit("a", "bulk", 1) for _ in range(20)]
    q.on_state_change([FakeReplica(waiting=10, running=10)])
    assert q.limit == 10
    assert q.try_admit("b", "bulk", 1) is None
    for t in held[:11]:
        t.release()  # type: ignore[union-attr]
    assert q.try_admit("b", "bulk", 1) is not None


async def test_the_reserve_is_left_to_a_tenant_under_its_share() -> None:
    cfg = AdmissionConfig(enabled=True, reserve_per_replica=2)
    q = AdmissionQueue(cfg)
    flood = [q.try_admit("heavy", "bulk", 1) for _ in range(14)]
    q.on_state_change([FakeReplica(waiting=4, running=10)])
    assert q.limit == 10
    for t in flood[:6]:
        t.release()  # type: ignore[union-attr]
    # 8 in flight: heavy, over its share, may not take the last 2 slots ...
    heavy = asyncio.create_task(q.acquire("heavy", "bulk", 1))
    await settle_loop()
    assert not heavy.done()
    # ... a light tenant with nothing out starts at once, past heavy's waiting request.
    light = asyncio.create_task(q.acquire("light", "bulk", 1))
    await settle_loop()
    assert light.done() and q.in_flight == 9 and q.queue_lengths() == {"heavy": 1}
    heavy.cancel()


async def test_the_in_flight_token_cap_queues_but_always_lets_one_through() -> None:
    cfg = AdmissionConfig(enabled=True, max_in_flight_tokens=1000)
    q = AdmissionQueue(cfg)
    big = q.try_admit("a", "bulk", 5000)
    assert big is not None  # larger than the cap, but the pool was idle
    task = asyncio.create_task(q.acquire("b", "bulk", 10))
    await settle_loop()
    assert not task.done()
    big.release()
    assert (await asyncio.wait_for(task, 1)).tenant == "b"


async def test_waits_are_measured_and_reported() -> None:
    clock = FakeClock()
    seen: list[tuple[str, str, float]] = []
    q, held = saturated_queue(1, clock=clock, on_wait=lambda t, c, s: seen.append((t, c, s)))
    task = asyncio.create_task(q.acquire("a", "interactive", 10))
    await settle_loop()
    clock.advance(0.25)
    held[0].release()
    ticket = await task
    assert ticket.waited_s == pytest.approx(0.25)
    assert seen == [("a", "interactive", pytest.approx(0.25))]
    assert q.waits["a"].count == 1 and q.waits["a"].max_s == pytest.approx(0.25)
    assert set(q.shares()) == {"warm", "a"}


async def test_retry_after_follows_the_release_rate() -> None:
    clock = FakeClock()
    q, held = saturated_queue(1, clock=clock)
    for _ in range(70):  # requests through one slot, one every 0.1 s: 10 releases per second
        task = asyncio.create_task(q.acquire("x", "bulk", 1))
        await settle_loop()
        clock.advance(0.1)
        held[0].release()
        held[0] = await task
    waiting = [asyncio.create_task(q.acquire("x", "bulk", 1)) for _ in range(20)]
    await settle_loop()
    assert q.retry_after_s("x", "bulk") == pytest.approx(2.1, rel=0.05)  # behind its own 20
    assert q.retry_after_s("new", "bulk") == pytest.approx(0.2, rel=0.05)  # alternates with x
    for t in waiting:
        t.cancel()


async def test_random_arrivals_cancellations_and_deadlines_leak_nothing() -> None:
    rng = random.Random(7)
    q = AdmissionQueue(AdmissionConfig(enabled=True, max_queue_len=20))
    q.on_state_change(IDLE)

    async def client(i: int) -> None:
        try:
            async with q.admit(f"t{i % 3}", rng.choice(["interactive", "bulk"]), rng.randint(1, 100),
                               deadline_s=rng.choice([0.005, 0.05, 1.0])) as ticket:
                await asyncio.sleep(rng.random() * 0.01)
                ticket.settle(rng.randint(1, 100))
        except AdmissionRejected:
            pass

    tasks = []
    for i in range(300):
        tasks.append(asyncio.create_task(client(i)))
        if i == 20:
            q.on_state_change([FakeReplica(waiting=30)])  # saturate: cap = in flight - excess
        if rng.random() < 0.2:
            rng.choice(tasks).cancel()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks, return_exceptions=True)
    assert q.in_flight == 0 and q.in_flight_tokens == 0 and q.queue_len == 0


class FakeTimers:
    """call_later that only records: the test fires the callbacks when it has moved the fake clock."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, object]] = []

    def __call__(self, delay: float, callback: object) -> object:
        self.pending.append((delay, callback))
        return callback

    def fire(self) -> None:
        """Run the callbacks due (all of them: the clock was moved past them)."""
        due, self.pending = self.pending, []
        for _, cb in due:
            cb()  # type: ignore[operator]


async def capped_flood(cfg: AdmissionConfig, clock: FakeClock,
                       timers: FakeTimers) -> tuple[AdmissionQueue, list[Ticket]]:
    """A pool capped at 36 with the heavy tenant holding 30 slots, having released 10 slots/s for the last second."""
    q = AdmissionQueue(cfg, clock=clock, call_later=timers)
    held = [q.try_admit("heavy", "bulk", 1) for _ in range(40)]
    q.on_state_change([FakeReplica(waiting=4, running=36)])
    assert q.limit == 36
    for t in held[:10]:
        clock.advance(0.1)
        t.release()  # type: ignore[union-attr]
    return q, [t for t in held[10:] if t is not None]


async def test_over_share_starts_are_paced_at_twice_the_release_rate() -> None:
    clock, timers = FakeClock(), FakeTimers()
    q, _ = await capped_flood(AdmissionConfig(enabled=True, pace_over_share=2.0, reserve_max_per_replica=0), clock,
                              timers)
    # A cohort of four arrives at once with six slots free: one starts, the next 1 / (2 x 10/s) = 50 ms later.
    tasks = [asyncio.create_task(q.acquire("heavy", "bulk", 1)) for _ in range(4)]
    await settle_loop()
    assert [t.done() for t in tasks] == [True, False, False, False]
    assert [round(d, 3) for d, _ in timers.pending] == [0.05]  # one timer, not one per waiter
    clock.advance(0.05)
    timers.fire()
    await settle_loop()
    assert [t.done() for t in tasks] == [True, True, False, False] and len(timers.pending) == 1
    for t in tasks:
        t.cancel()


async def test_a_tenant_under_its_share_is_not_paced() -> None:
    clock, timers = FakeClock(), FakeTimers()
    q, _ = await capped_flood(AdmissionConfig(enabled=True, pace_over_share=2.0, reserve_max_per_replica=0), clock,
                              timers)
    assert q.try_admit("heavy", "bulk", 1) is not None
    assert q.try_admit("heavy", "bulk", 1) is None  # paced
    light = [q.try_admit("light", "bulk", 1) for _ in range(3)]
    assert all(t is not None and not t.over_share for t in light)


async def test_pacing_off_starts_a_cohort_at_once() -> None:
    clock, timers = FakeClock(), FakeTimers()
    q, _ = await capped_flood(AdmissionConfig(enabled=True, pace_over_share=0.0, reserve_max_per_replica=0), clock,
                              timers)
    assert all(q.try_admit("heavy", "bulk", 1) is not None for _ in range(6))
    assert timers.pending == []


async def test_the_reserve_follows_the_arrivals_of_tenants_under_their_share() -> None:
    clock, timers = FakeClock(), FakeTimers()
    cfg = AdmissionConfig(enabled=True, pace_over_share=0.0, reserve_max_per_replica=4, reserve_max_fraction=0.25)
    q, held = await capped_flood(cfg, clock, timers)
    assert q.reserve == 0  # only the flood so far: it may fill the cap
    for t in held[:8]:  # a light tenant arrives as fast as slots free up
        clock.advance(0.1)
        t.release()
        assert q.try_admit("light", "bulk", 1) is not None
    q.on_state_change([FakeReplica(running=36, kv_usage=0.99)])  # full, nothing queued: the cap stays
    assert q.limit == 30 and q.reserve == 4  # rho ~ 1: the ceiling
    for t in held[8:12]:
        t.release()
    # Four slots free below the cap: the flood may not take them, the light tenant may.
    assert q.try_admit("heavy", "bulk", 1) is None
    assert q.try_admit("light", "bulk", 1) is not None


async def test_declared_slots_engage_the_cap_before_any_scrape_sees_a_queue() -> None:
    q = AdmissionQueue(CFG)
    q.on_state_change([FakeReplica(running=0, capacity=8)])  # idle, 8 slots declared (max_num_seqs)
    assert q.limit is None and q.capacity == 8
    assert all(q.try_admit("heavy", "bulk", 1) is not None for _ in range(8))
    assert q.try_admit("heavy", "bulk", 1) is None  # the 9th would queue in the engine: it waits here
    assert q.limit == 8


async def test_without_declared_slots_the_fast_path_sends_until_a_scrape_says_saturated() -> None:
    q = AdmissionQueue(CFG)
    q.on_state_change([FakeReplica(running=0)])
    assert q.capacity is None
    assert all(q.try_admit("heavy", "bulk", 1) is not None for _ in range(20))


def gated(hold_s: float = 1.0) -> AdmissionConfig:
    """Prefill gate of 1, no pacing, no reserve; the gate engages from one request waiting in the gateway."""
    return AdmissionConfig(enabled=True, pace_over_share=0.0, reserve_max_per_replica=0, max_waiting_per_replica=1,
                           over_share_prefills_per_replica=1, first_token_hold_s=hold_s)


async def flood_at_the_cap(q: AdmissionQueue, held: list[Ticket]) -> tuple[list[Ticket], list[asyncio.Task[Ticket]]]:
    """The flood takes the 6 free slots (streams, no backlog yet: not gated), then 2 more wait; 1 slot frees."""
    started = [q.try_admit("heavy", "bulk", 1, watch_first_token=True) for _ in range(6)]
    assert all(t is not None and t.over_share for t in started)
    waiters = [asyncio.create_task(q.acquire("heavy", "bulk", 1, watch_first_token=True)) for _ in range(2)]
    await settle_loop()
    held[0].release()
    await settle_loop()
    return [t for t in started if t is not None], waiters


async def test_an_over_share_start_waits_for_the_previous_ones_first_token() -> None:
    clock, timers = FakeClock(), FakeTimers()
    q, held = await capped_flood(gated(), clock, timers)
    started, waiters = await flood_at_the_cap(q, held)
    assert not any(w.done() for w in waiters)  # a slot is free, but the flood's starts have not prefilled yet
    assert [round(d, 3) for d, _ in timers.pending] == [1.0]  # the hold's bound, not forever
    for t in started:
        t.first_token()
    await settle_loop()
    assert [w.done() for w in waiters] == [True, False]  # the free slot: one start, which the gate then counts
    held[1].release()
    light = asyncio.create_task(q.acquire("light", "bulk", 1, watch_first_token=True))
    await settle_loop()
    assert light.done() and not waiters[1].done()  # the free slot goes to the tenant under its share, ungated
    waiters[1].cancel()


async def test_a_start_whose_first_token_is_never_seen_holds_the_flood_only_for_the_hold() -> None:
    clock, timers = FakeClock(), FakeTimers()
    q, held = await capped_flood(gated(hold_s=0.5), clock, timers)
    _, waiters = await flood_at_the_cap(q, held)
    assert not waiters[0].done()
    clock.advance(0.5)
    timers.fire()
    await settle_loop()
    assert waiters[0].done()
    waiters[1].cancel()


async def test_unwatched_requests_and_an_uncapped_pool_are_not_gated() -> None:
    clock, timers = FakeClock(), FakeTimers()
    cfg = AdmissionConfig(enabled=True, pace_over_share=0.0, reserve_max_per_replica=0,
                          over_share_prefills_per_replica=1)
    q, _ = await capped_flood(cfg, clock, timers)
    assert all(q.try_admit("heavy", "bulk", 1) is not None for _ in range(3))  # not streams: nothing to watch
    idle = AdmissionQueue(cfg, clock=clock, call_later=timers)
    assert all(idle.try_admit("heavy", "bulk", 1, watch_first_token=True) is not None for _ in range(3))


async def test_releasing_a_start_before_its_first_token_opens_the_gate() -> None:
    clock, timers = FakeClock(), FakeTimers()
    q, held = await capped_flood(gated(), clock, timers)
    started, waiters = await flood_at_the_cap(q, held)
    assert not waiters[0].done()
    for t in started:
        t.release()  # upstream errors before any token
    await settle_loop()
    assert [w.done() for w in waiters] == [True, False]  # the gate now counts the one that went
    waiters[0].result().release()
    await settle_loop()
    assert waiters[1].done()


async def test_a_backlog_below_the_saturation_threshold_is_not_gated() -> None:
    clock, timers = FakeClock(), FakeTimers()
    cfg = AdmissionConfig(enabled=True, pace_over_share=0.0, reserve_max_per_replica=0, max_waiting_per_replica=3,
                          over_share_prefills_per_replica=1)
    q, held = await capped_flood(cfg, clock, timers)
    _, waiters = await flood_at_the_cap(q, held)
    assert waiters[0].done()  # two waiting, fewer than three: a moment at the cap, drained as slots free
    waiters[1].cancel()


async def test_a_tenant_below_its_recent_share_takes_the_next_slots_before_the_flood() -> None:
    clock = FakeClock()
    q = AdmissionQueue(AdmissionConfig(enabled=True, pace_over_share=0.0), clock=clock)
    q.on_state_change([FakeReplica(running=0, capacity=4)])
    held = [q.try_admit("heavy", "bulk", 100) for _ in range(4)]
    flood = [asyncio.create_task(q.acquire("heavy", "bulk", 100)) for _ in range(8)]  # the cap engages
    await settle_loop()
    for t in held:  # four of the flood start while capped: heavy got 400 tokens lately, light none
        t.release()  # type: ignore[union-attr]
    await settle_loop()
    light = [asyncio.create_task(q.acquire("light", "bulk", 100)) for _ in range(3)]
    await settle_loop()
    for f in flood[:2]:
        clock.advance(0.2)
        (await f).release()
    await settle_loop()
    # Plain VTC alternates (light's counter is lifted to heavy's); below its recent share (as a newcomer it counts
    # as half of heavy's, 200, then 300 after its first start: under 400 still), light goes twice.
    assert [t.done() for t in light] == [True, True, False]
    assert sum(f.done() for f in flood) == 4
    for t in (*flood, light[2]):
        t.cancel()


def test_a_pool_of_fewer_than_ten_slots_keeps_no_reserve() -> None:
    q = AdmissionQueue(AdmissionConfig(enabled=True))
    q.on_state_change([FakeReplica(waiting=0, running=0, capacity=4)])
    assert q._demand_reserve(1) == 0
    q64 = AdmissionQueue(AdmissionConfig(enabled=True))
    q64.on_state_change([FakeReplica(waiting=0, running=0, capacity=64)])
    q64.limit = 64
    assert q64._demand_reserve(1) == 0  # nobody under its share arrived yet: the floor
