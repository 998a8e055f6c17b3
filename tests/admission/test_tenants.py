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


async def test_with_one_tenant_the_default_queue_is_a_pass_through_even_when_saturated() -> None:
    q = AdmissionQueue(AdmissionConfig(), clock=FakeClock())
    q.on_state_change(FULL)
    tickets = [q.try_admit("only", "bulk", 10) for _ in range(20)]
    assert all(t is not None for t in tickets) and q.in_flight == 20 and q.queue_len == 0


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
    q.on_state_change(FULL)  # heavy is the only tenant again once light's window passed
    assert q.try_admit("heavy", "bulk", 10) is not None
