"""app/admission/hook.py: below saturation the hook hands the path nothing to await; saturated, the wait."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from app.admission.fast import FastTicket
from app.admission.hook import FairAdmission
from app.admission.queue import AdmissionQueue
from app.config.admission import AdmissionConfig
from tests.admission.fakes import FakeReplica


class _Waits:
    def __init__(self) -> None:
        self.waits: list[tuple[str, str, str, float]] = []

    def record_queue_wait(self, pool: str, tenant: str, route_class: str, seconds: float) -> None:
        self.waits.append((pool, tenant, route_class, seconds))

    def queue_wait_zeros(self) -> Any:
        return lambda key: self.waits.append((*key, 0.0))


def _ctx(tenant: str) -> Any:
    return SimpleNamespace(route_class=SimpleNamespace(route_class="bulk"), tenant=SimpleNamespace(id=tenant),
                           pinned=("main", "r0"), queue_ticket=None, stream=False, body={}, usage=None,
                           estimated_input_tokens=10, route=None, surface=SimpleNamespace(output_cap_fields=()))


def _hook(queue: AdmissionQueue, telemetry: _Waits) -> FairAdmission:
    return FairAdmission({"main": queue}, lambda: None, None, telemetry)  # type: ignore[arg-type,return-value]


def test_below_saturation_before_pick_returns_nothing_to_await_and_counts_a_zero_wait() -> None:
    telemetry = _Waits()
    queue = AdmissionQueue(AdmissionConfig(), pool="main")
    ctx = _ctx("a")
    assert _hook(queue, telemetry).before_pick(ctx, None) is None  # type: ignore[arg-type]
    assert isinstance(ctx.queue_ticket, FastTicket) and queue.in_flight == 1
    assert telemetry.waits == [("main", "a", "bulk", 0.0)]


async def test_saturated_before_pick_returns_the_wait_for_a_slot() -> None:
    telemetry = _Waits()
    queue = AdmissionQueue(AdmissionConfig(enabled=True, max_waiting_per_replica=4), pool="main")
    held = [queue.try_admit("warm", "bulk", 10) for _ in range(8)]
    queue.on_state_change([FakeReplica(waiting=4, running=8)])  # capped at 4 below the 8 in flight
    ctx = _ctx("a")
    pending = _hook(queue, telemetry).before_pick(ctx, None)  # type: ignore[arg-type]
    assert pending is not None and ctx.queue_ticket is None
    task = asyncio.ensure_future(pending)
    await asyncio.sleep(0)
    assert not task.done()
    for t in held[:5]:
        t.release()  # type: ignore[union-attr]
    await asyncio.wait_for(task, 1)
    assert ctx.queue_ticket is not None and ctx.queue_ticket.queued and telemetry.waits[0][3] > 0.0
