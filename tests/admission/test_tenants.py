"""Fair admission is on by default only where a pool serves more than one tenant."""

import asyncio

from app.admission.queue import AdmissionQueue
from app.admission.step import build_queues
from app.admission.tenants import ActiveTenants
from app.config.admission import AdmissionConfig
from tests.admission.fakes import FakeClock, FakeReplica

FULL = [FakeReplica(waiting=4, running=8, capacity=8)]  # every slot taken and a queue in the engine


def test_a_tenant_counts_as_present_for_its_window() -> None:
    tenants = ActiveTenants(60.0)
    assert not tenants.arrived("a", 0.0)
    assert tenants.arrived("b", 30.0) and tenants.several()
    tenants.prune(61.0)  # a's last request is 61 s old
    assert not tenants.several()


def test_by_default_every_pool_gets_a_queue_and_only_enabled_false_opts_out() -> None:
    configs = {"a": AdmissionConfig(), "b": AdmissionConfig(enabled=False), "c": AdmissionConfig(enabled=True)}
    queues = build_queues(configs)
    assert sorted(queues) == ["a", "c"]


IDLE_8 = [FakeReplica(running=0, capacity=8)]  # 8 slots declared, nothing running yet


async def test_with_one_tenant_the_default_queue_passes_up_to_the_engines_slots_then_keeps_arrival_order() -> None:
    q = AdmissionQueue(AdmissionConfig(deadline_s={"interactive": 0.01, "bulk": 0.01}), clock=FakeClock())
    q.on_state_change(IDLE_8)
    first = [q.try_admit("only", "bulk", 10) for _ in range(8)]
    assert all(t is not None for t in first)
    waiters = [asyncio.create_task(q.acquire("only", "bulk", 10)) for _ in range(3)]
    await asyncio.sleep(0.05)  # five times the deadline: a lone tenant's request waits, it is not refused
    assert q.limit == 8  # the slots were full: the cap engaged
    assert not any(w.done() for w in waiters) and q.queue_len == 3 and not q.rejected
    first[0].release()  # type: ignore[union-attr]
    await asyncio.sleep(0)
    assert [w.done() for w in waiters] == [True, False, False]  # one out, one in, oldest first
    for w in waiters[1:]:
        w.cancel()


async def test_a_lone_tenant_past_a_full_queue_goes_to_the_engine_instead_of_a_refusal() -> None:
    q = AdmissionQueue(AdmissionConfig(max_queue_len=2), clock=FakeClock())
    q.on_state_change(IDLE_8)
    assert all(q.try_admit("only", "bulk", 10) is not None for _ in range(8))
    waiting = [asyncio.create_task(q.acquire("only", "bulk", 10)) for _ in range(2)]
    await asyncio.sleep(0)
    extra = await asyncio.wait_for(q.acquire("only", "bulk", 10), 1)  # the queue is full: passed through
    assert not extra.queued and q.in_flight == 9 and q.queue_len == 2
    for w in waiting:
        w.cancel()


async def test_a_tenant_arriving_beside_a_lone_one_takes_the_next_slot_not_its_backlog() -> None:
    q = AdmissionQueue(AdmissionConfig(), clock=FakeClock())
    q.on_state_change(IDLE_8)
    held = [q.try_admit("heavy", "bulk", 10) for _ in range(8)]
    backlog = [asyncio.create_task(q.acquire("heavy", "bulk", 10)) for _ in range(5)]
    await asyncio.sleep(0)
    light = asyncio.create_task(q.acquire("light", "bulk", 10))
    await asyncio.sleep(0)
    assert not light.done()
    held[0].release()  # type: ignore[union-attr]
    await asyncio.sleep(0)
    assert light.done() and not any(b.done() for b in backlog)
    for b in backlog:
        b.cancel()


async def test_a_second_tenant_makes_the_default_queue_hold_the_flood_at_saturation() -> None:
    clock = FakeClock()
    q = AdmissionQueue(AdmissionConfig(), clock=clock)
    flood = [q.try_admit("heavy", "bulk", 10) for _ in range(8)]
    assert all(flood)
    q.on_state_change(FULL)
    assert q.try_admit("light", "bulk", 10) is None  # two tenants, no room: the fair queue decides
    waiter = asyncio.create_task(q.acquire("light", "bulk", 10))
    await asyncio.sleep(0)
    assert q.limit == 4  # 8 out, 4 of them queued in the engine: the cap keeps the engine full, not queueing
    for t in flood[:5]:
        t.release()  # type: ignore[union-attr]
    ticket = await asyncio.wait_for(waiter, 1)
    assert ticket.queued and ticket.tenant == "light"
    clock.advance(61.0)
    q.on_state_change([FakeReplica(running=4, capacity=8)])  # heavy alone again once light's window passed
    assert q.try_admit("heavy", "bulk", 10) is not None and q.limit is None
