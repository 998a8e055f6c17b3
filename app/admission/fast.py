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

import sys
from collections.abc import Callable
from typing import Any

from app.admission.pace import EventRate
from app.admission.tenants import ActiveTenants
from app.admission.vtc import VirtualTokenCounter
from app.config.admission import AdmissionConfig, RouteClass
from app.queue_ticket import Ticket


class FastTicket(Ticket):
    """A slot taken below saturation; a prediction of 0 means none was made (settle_ticket charges the actual).

    Told of a stream's first token like any ticket (the queue ignores it: only over-share starts enter its
    prefill gate)."""

    __slots__ = ()
    _queue: FastPath

    def __init__(self, queue: FastPath, tenant: str, route_class: RouteClass, predicted_tokens: int) -> None:
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


class FastPath:
    """The fast path of app.admission.queue.AdmissionQueue (its base): the bound below which a start is a
    FastTicket, and the start itself. The attributes are the queue's."""

    cfg: AdmissionConfig
    in_flight: int
    limit: int | None
    capacity: int | None
    tenant_in_flight: dict[str, int]
    served_tokens: dict[str, float]
    _sched: VirtualTokenCounter[Any]
    _tenants: ActiveTenants | None
    _releases: EventRate
    _clock: Callable[[], float]
    # The fast path's one test: a request starts as a FastTicket while in_flight is below this (the capacity,
    # or no bound while it is unknown); 0 while capped, while anything waits, or with a token cap (that one needs
    # each start's prediction). _refresh_fast keeps it at every change of the cap, the capacity or the backlog.
    _open_below: int = 0

    def start_now(self, tenant: str, route_class: RouteClass) -> Ticket | None:
        """Below saturation, a FastTicket without a prediction (nothing is charged at start); else None: then
        try_admit with the prediction."""
        tenants = self._tenants
        if tenants is not None:
            tenants.last[tenant] = self._clock()  # ActiveTenants.arrived without the call: on every request
        if self.in_flight < self._open_below:
            return self._start_fast(tenant, route_class, 0)
        return None

    def _start_fast(self, tenant: str, route_class: RouteClass, predicted_tokens: int) -> Ticket:
        """A FastTicket counted in flight (start_now's, and try_admit's below saturation with a prediction)."""
        self.in_flight += 1
        tif = self.tenant_in_flight
        tif[tenant] = tif.get(tenant, 0) + 1
        return FastTicket(self, tenant, route_class, predicted_tokens)

    def _refresh_fast(self) -> None:
        """Re-derive the bound after the cap, the capacity or the backlog changed."""
        if self.limit is None and not len(self._sched) and self.cfg.max_in_flight_tokens is None:
            self._open_below = self.capacity if self.capacity is not None else sys.maxsize
        else:
            self._open_below = 0

    # What a FastTicket calls back on its queue (the queue's methods).
    pool: str
    _first_token: Callable[[Ticket], None]
    _release: Callable[[Ticket], None]
    _correct: Callable[[str, int], None]
    _pump: Callable[[], None]

    def _release_contended(self, ticket: Ticket, tokens: int) -> None:
        """A FastTicket released (its counts done) while capped or with requests waiting."""
        if len(self._sched):  # saturation began while it ran: its service counts in the fair order from now on
            if self.cfg.enabled is not False:
                self._sched.charge(ticket.tenant, tokens)
            self._pump()
