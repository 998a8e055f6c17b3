"""What the admission queue hands out: a started request's Ticket, the refusal, and wait statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from app.config.admission import RouteClass

RejectReason = Literal["queue_full", "deadline"]


class AdmissionRejected(Exception):
    """The request cannot start in time (or the queue is full): map to 429 + Retry-After, or degrade."""

    def __init__(self, retry_after_s: float, reason: RejectReason, *, tenant: str = "",
                 route_class: RouteClass = "bulk", waited_s: float = 0.0) -> None:  # fmt: skip
        super().__init__(f"admission rejected ({reason}); retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s
        self.reason = reason
        self.tenant = tenant
        self.route_class = route_class
        self.waited_s = waited_s


@dataclass(slots=True)
class WaitStats:
    """Waits of one tenant's requests that went through the queue (fast-path ones are not counted)."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        """One observation."""
        self.count += 1
        self.total_s += seconds
        if seconds > self.max_s:
            self.max_s = seconds


class TicketOwner(Protocol):
    """What a ticket calls back on the queue that issued it (app/admission/queue.py's AdmissionQueue)."""

    pool: str

    def _first_token(self, ticket: Ticket) -> None: ...

    def _release(self, ticket: Ticket) -> None: ...

    def _correct(self, tenant: str, delta: int) -> None: ...


class Ticket:
    """A started request's slot: settle() with the actual cost, release() (or leave `async with`) when done."""

    __slots__ = ("_correction", "_queue", "_released", "_settled", "over_share", "predicted_tokens", "queued",
                 "route_class", "tenant", "waited_s")  # fmt: skip

    def __init__(self, queue: TicketOwner, tenant: str, route_class: RouteClass, predicted_tokens: int,
                 waited_s: float, queued: bool, over_share: bool = False) -> None:  # fmt: skip
        self._queue = queue
        self.tenant = tenant
        self.route_class = route_class
        self.predicted_tokens = predicted_tokens
        self.waited_s = waited_s  # 0 on the fast path: what the span and x-kvgate-route report
        self.queued = queued
        # Started while the pool was capped and its tenant already held its weighted share of the slots: an
        # engine scheduling by priority should run it after those of tenants under their share.
        self.over_share = over_share
        self._settled = False
        self._correction = 0
        self._released = False

    @property
    def pool(self) -> str:
        """The pool whose slot this is."""
        return self._queue.pool

    @property
    def charged_tokens(self) -> int:
        """What the tenant's fair share is charged: the prediction, or the actual cost once settled."""
        return self.predicted_tokens + self._correction

    def first_token(self) -> None:
        """The response's first token has passed (a watched stream): the prefill gate may let the next start go."""
        if not self._released:
            self._queue._first_token(self)

    def settle(self, actual_tokens: int) -> None:
        """Correct the tenant's charge with what the request really cost (uncached prompt + output); once."""
        if self._settled:
            return
        self._settled = True
        self._correction = actual_tokens - self.predicted_tokens
        self._queue._correct(self.tenant, self._correction)

    def release(self, actual_tokens: int | None = None) -> None:
        """Free the slot (idempotent), settling first when the actual cost is given; the next waiter may start."""
        if actual_tokens is not None:
            self.settle(actual_tokens)
        if self._released:
            return
        self._released = True
        self._queue._release(self)
