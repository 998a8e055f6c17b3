"""The hang watch: a whole-body wait is cancelled once its replica's probes took it out, not while it is healthy."""

from __future__ import annotations

import asyncio

from app.routing.hang import HangWatch
from app.routing.state import ReplicaState


async def _wait_watched(watch: HangWatch, replica: ReplicaState) -> str:
    task = watch.enter(replica)
    try:
        await asyncio.sleep(3600)
        return "answered"
    except asyncio.CancelledError:
        return "hung" if watch.leave(task) else "cancelled"


async def test_a_wait_on_a_replica_that_turns_unhealthy_is_cancelled_as_hung() -> None:
    watch, sick, well = HangWatch(0.01), ReplicaState("http://a:8000"), ReplicaState("http://b:8000")
    on_sick = asyncio.create_task(_wait_watched(watch, sick))
    on_well = asyncio.create_task(_wait_watched(watch, well))
    await asyncio.sleep(0.05)  # several sweeps while both replicas are healthy: nothing happens
    assert not on_sick.done()
    sick.healthy = False
    assert await asyncio.wait_for(on_sick, 10) == "hung"
    await asyncio.sleep(0.05)
    assert not on_well.done()
    on_well.cancel()
    assert await on_well == "cancelled"  # a cancel that is not the watch's stays a cancel


async def test_a_wait_that_left_is_not_swept() -> None:
    watch, replica = HangWatch(0.01), ReplicaState("http://a:8000")
    task = watch.enter(replica)
    assert not watch.leave(task)
    replica.healthy = False
    await asyncio.sleep(0.05)  # the sweep finds nothing (and stops re-arming)
    assert watch._timer is None
