"""A whole-body attempt on a replica that hangs: no byte comes before the whole answer, so silence says nothing;
the replica's probes do. While such an attempt waits, every `upstream.idle_timeout_s` the guard looks at its
replica: once the probes have taken it out (a SIGSTOPped or wedged engine answers no /health), the attempt is
cancelled and retried elsewhere, instead of waiting `upstream.read_timeout_s`.

One timer per attempt, re-armed while the replica stays healthy (no task, nothing per byte).
"""

from __future__ import annotations

import asyncio

from app.routing.state import ReplicaState


class HangGuard:
    """Cancels the current task when its replica is unhealthy at one of the periodic checks."""

    __slots__ = ("_every_s", "_replica", "_task", "_timer", "fired")

    def __init__(self, replica: ReplicaState, every_s: float) -> None:
        self._replica = replica
        self._every_s = every_s
        self._task = asyncio.current_task()
        self.fired = False
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(every_s, self._check)

    def _check(self) -> None:
        if self._replica.healthy:
            self._timer = asyncio.get_running_loop().call_later(self._every_s, self._check)
            return
        self._timer = None
        if self._task is not None:
            self.fired = True
            self._task.cancel()

    def close(self) -> None:
        """The attempt is over (answered, failed or cancelled otherwise)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
