"""The admission queue's fast path below saturation: a FastTicket, counted in flight and charged to no one.

Below saturation (no cap, nothing waiting) the queue has nothing to order, so a start is one comparison and
the in-flight counts (AdmissionQueue.start_now / try_admit), and its release the same counts back, the
tenant's served tokens and the release's time (the release rate steers pacing once a cap engages). Kept apart
from app/admission/queue.py because this is what every request runs: every Python call here costs several
times its hot-loop figure in the request path (experiments/admission_micro.py), so the release does the
counting itself instead of calling into the queue.

Nothing is charged to the fair order at start: with nobody waiting, a virtual token counter's charge is lifted
away when its tenant next waits (VTC lifts a tenant joining the queue to the lowest counter of those waiting,
or to the last one's to leave), so it could not change who goes first. If requests wait by the time it ends
(saturation began while it ran), its cost is charged then: its service counts in the fair order from there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from app.admission.pace import EventRate
from app.config.admission import RouteClass
from app.queue_ticket import Ticket, TicketOwner


class FastOwner(TicketOwner, Protocol):
    """What a FastTicket counts on its queue (app.admission.queue.AdmissionQueue)."""

    in_flight: int
    tenant_in_flight: dict[str, int]
    served_tokens: dict[str, float]
    _open_below: int
    _releases: EventRate
    _clock: Callable[[], float]

    def _release_contended(self, ticket: Ticket, tokens: int) -> None: ...


class FastTicket(Ticket):
    """A slot taken below saturation; a prediction of 0 means none was made (settle_ticket charges the actual).

    Told of a stream's first token like any ticket (the queue ignores it: only over-share starts enter its
    prefill gate)."""

    __slots__ = ()
    _queue: FastOwner

    def __init__(self, queue: FastOwner, tenant: str, route_class: RouteClass, predicted_tokens: int) -> None:
        self._queue = queue
        self.tenant = tenant
        self.route_class = route_class
        self.predicted_tokens = predicted_tokens
        self.waited_s = 0.0
        self.queued = False
        self.over_share = False
        self._settled = False
        self._correction = 0
        self._released = False

    def settle(self, actual_tokens: int) -> None:
        """Keep the actual cost for the release (once); nothing was charged, so nothing is corrected now."""
        if self._settled:
            return
        self._settled = True
        self._correction = actual_tokens - self.predicted_tokens

    def release(self, actual_tokens: int | None = None) -> None:
        """Free the slot (idempotent) with the cost known by then (the actual when given or settled)."""
        if actual_tokens is not None and not self._settled:
            self._settled = True
            self._correction = actual_tokens - self.predicted_tokens
        if self._released:
            return
        self._released = True
        q = self._queue
        q.in_flight -= 1
        tenant = self.tenant
        tif = q.tenant_in_flight
        left = tif[tenant] - 1
        if left:
            tif[tenant] = left
        else:
            del tif[tenant]
        tokens = self.predicted_tokens + self._correction
        served = q.served_tokens
        served[tenant] = served.get(tenant, 0.0) + tokens
        q._releases.times.append(q._clock())
        if not q._open_below:  # capped, or requests wait: the queue's own work (charge, the next start)
            q._release_contended(self, tokens)
