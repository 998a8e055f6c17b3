"""Cancellation that holds when a library swallows it.

redis-py 8.1's asyncio client can absorb a CancelledError delivered while a command is in flight: the command's
coroutine returns (or raises an ordinary error) and the task goes on, still marked as cancelling. The peer-load
loop then slept into its next round and `Gateway.stop` waited on it for ever: 3 of 12 runs of
tests/routing/test_peer_load.py's two-gateway test hung to the 120 s timeout on a loaded machine. Background
loops that call the store check `raise_if_cancelled()` after each call, and `cancel_and_wait` cancels again
while the task lives, so a stop always ends.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("kvgate.cancel")

# Between repeated cancels of a task that outlived one: long enough for an honest task to unwind its finally.
RECANCEL_S = 0.2


def raise_if_cancelled() -> None:
    """Raise CancelledError if the current task was cancelled and something under it swallowed that."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def cancel_and_wait(task: asyncio.Task[object], *, bound_s: float = 10.0) -> None:
    """Cancel `task` and wait until it has ended, cancelling again every RECANCEL_S while it lives; after
    `bound_s` it is left running and logged (a stop must end)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while not task.done():
        task.cancel()
        # asyncio.wait neither raises the task's CancelledError nor cancels it on timeout; a cancel of the
        # caller itself still propagates.
        await asyncio.wait((task,), timeout=RECANCEL_S)
        if loop.time() >= deadline and not task.done():
            log.error("background task %s ignored cancellation for %.0f s; left running", task.get_name(), bound_s)
            return
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s ended with an error", task.get_name(), exc_info=task.exception())
