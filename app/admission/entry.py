"""The admission queue's entry points that hold no state of its own: `async with queue.admit(...)` and a waiter.

Kept apart from app/admission/queue.py (which decides who starts when) so that file stays one job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from app.config.admission import RouteClass
from app.queue_ticket import Ticket


class _Admits(Protocol):
    """What Admission calls on its queue (app.admission.queue.AdmissionQueue)."""

    def try_admit(self, tenant: str, route_class: RouteClass, predicted_tokens: int, *,
                  watch_first_token: bool = False) -> Ticket | None: ...

    async def wait(self, tenant: str, route_class: RouteClass, predicted_tokens: int,
                   deadline_s: float | None = None, *, watch_first_token: bool = False) -> Ticket: ...


class Waiter:
    """A request waiting in the queue: whose, its class and cost, the future its ticket lands in, its deadline."""

    __slots__ = ("enqueued_at", "future", "route_class", "tenant", "timer", "tokens", "watch")

    def __init__(self, tenant: str, route_class: RouteClass, tokens: int, future: asyncio.Future[Ticket],
                 now: float, watch: bool) -> None:
        self.tenant = tenant
        self.route_class = route_class
        self.tokens = tokens
        self.future = future
        self.enqueued_at = now
        self.watch = watch
        self.timer: asyncio.TimerHandle | None = None


class Admission:
    """`async with queue.admit(...)`: a class, not a generator, so the fast path costs two method calls."""

    __slots__ = ("_args", "_queue", "_ticket")

    def __init__(self, queue: _Admits, args: tuple[str, RouteClass, int, float | None, bool]) -> None:
        self._queue = queue
        self._args = args
        self._ticket: Ticket | None = None

    async def __aenter__(self) -> Ticket:
        tenant, route_class, tokens, deadline_s, watch = self._args
        ticket = self._queue.try_admit(tenant, route_class, tokens, watch_first_token=watch)
        if ticket is None:
            ticket = await self._queue.wait(tenant, route_class, tokens, deadline_s, watch_first_token=watch)
        self._ticket = ticket
        return ticket

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._ticket is not None:
            self._ticket.release()


def loop_call_later(delay: float, callback: Callable[[], None]) -> object:
    """The running loop's call_later; without a loop (nothing can be waiting) there is nothing to wake."""
    try:
        return asyncio.get_running_loop().call_later(delay, callback)
    except RuntimeError:
        return None
