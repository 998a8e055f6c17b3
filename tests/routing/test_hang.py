"""The hang guard: a whole-body wait is cancelled once its replica's probes took it out, not while it is healthy."""

from __future__ import annotations

import asyncio

from app.routing.hang import HangGuard
from app.routing.state import ReplicaState


async def _wait_guarded(replica: ReplicaState, checks_s: float, ran: list[HangGuard]) -> str:
    guard = HangGuard(replica, checks_s)
    ran.append(guard)
    try:
        await asyncio.sleep(3600)
        return "answered"
    except asyncio.CancelledError:
        return "hung" if guard.fired else "cancelled"
    finally:
        guard.close()


async def test_a_wait_on_a_replica_that_turns_unhealthy_is_cancelled_as_hung() -> None:
    replica, ran = ReplicaState("http://a:8000"), []
    task = asyncio.create_task(_wait_guarded(replica, 0.01, ran))
    await asyncio.sleep(0.05)  # several checks of a healthy replica: nothing happens
    assert not task.done()
    replica.healthy = False
    assert await asyncio.wait_for(task, 10) == "hung"


async def test_a_closed_guard_never_cancels() -> None:
    replica = ReplicaState("http://a:8000")
    replica.healthy = False
    guard = HangGuard(replica, 0.01)
    guard.close()
    await asyncio.sleep(0.05)
    assert not guard.fired
