"""One pool's admission queue: a request starts at once while the pool has room, else waits fairly for a slot.

    async with queue.admit(tenant, route_class, predicted_tokens) as ticket:
        ...send upstream...; ticket.settle(actual_tokens)

Below saturation (no cap, nothing waiting) a request starts as a FastTicket (app/admission/fast.py); capped
with room and nobody waiting, the ticket is granted without suspending either. Saturated: the request waits in
its tenant's FIFO, released in virtual-token-counter order (app.admission.vtc) when a ticket of this pool is
released or a scrape (`on_state_change`) raises the cap. A request that cannot start within its class's deadline,
or finds the queue full, gets AdmissionRejected. A waiting task that is cancelled (the client went away) leaves
the queue; nothing is charged for it.

Everything runs on one event loop, so plain attributes need no locks. Metrics are plain attributes for the
telemetry layer to read: queue lengths per tenant, wait statistics (and an `on_wait` hook per observation),
service share per tenant, rejections.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable

from app.admission.entry import Admission, Waiter, loop_call_later
from app.admission.fast import FastPath
from app.admission.limit import learn_capacity, next_limit
from app.admission.pace import EventRate, demand_reserve, pace_gap_s
from app.admission.prefill import PrefillGate
from app.admission.recent import RecentService
from app.admission.saturation import ReplicaLoad, Saturation, assess
from app.admission.tenants import ActiveTenants
from app.admission.vtc import Entry, VirtualTokenCounter
from app.config.admission import AdmissionConfig, RouteClass
from app.queue_ticket import AdmissionRejected, RejectReason, Ticket, WaitStats

__all__ = ["AdmissionQueue", "AdmissionRejected", "Ticket", "WaitStats"]

MIN_RETRY_AFTER_S = 0.1
CallLater = Callable[[float, Callable[[], None]], object]  # (delay s, callback) -> handle


class AdmissionQueue(FastPath):
    """The admission queue of one pool (one per pool, owned by the gateway; no globals)."""

    def __init__(self, cfg: AdmissionConfig, *, pool: str = "", clock: Callable[[], float] = time.monotonic,
                 on_wait: Callable[[str, RouteClass, float], None] | None = None,
                 call_later: CallLater | None = None) -> None:
        self.cfg = cfg
        self.pool = pool
        self._clock = clock
        self._on_wait = on_wait
        self._call_later = call_later or loop_call_later
        self._sched: VirtualTokenCounter[Waiter] = VirtualTokenCounter(cfg.tenant_weights, cfg.default_weight)
        self._releases = EventRate()
        self._under_arrivals = EventRate()  # requests of tenants under their share that arrived while capped
        self._paced_until = 0.0  # no over-share start before this (clock time)
        self._pace_timer: object | None = None
        self._pace_due = 0.0  # when the latest armed pace timer fires
        self._prefills = PrefillGate(cfg.first_token_hold_s)  # watched over-share starts without a first token
        self._recent = RecentService(cfg.share_window_s, self._sched.weight)  # service while capped, decaying
        # enabled unset: fair only while more than one tenant is served (app.admission.tenants)
        self._tenants = ActiveTenants(cfg.tenant_window_s) if cfg.enabled is None else None
        # --- metrics and state, read-only for others ---
        self.in_flight = 0  # tickets granted and not released
        self.in_flight_tokens = 0  # their predicted tokens
        self.limit: int | None = None  # cap on in_flight while engaged; None = no cap
        self.capacity: int | None = None  # requests the pool's engines run at once, learned from scrapes
        self.reserve = 0  # slots of `limit` only tenants under their share may take (demand-sized per scrape)
        self.tenant_in_flight: dict[str, int] = {}  # tenants with tickets out
        self.saturation = Saturation(False, None, 0, 0, 0)
        self.waits: dict[str, WaitStats] = {}
        self.served_tokens: dict[str, float] = {}  # charged at start, corrected at settle (fast: at release)
        self.rejected: dict[tuple[str, RejectReason], int] = {}
        self._refresh_fast()  # the fast path's bound (app.admission.fast.FastPath)

    # ------------------------------------------------------------------------------------------ entry points
    def admit(self, tenant: str, route_class: RouteClass, predicted_tokens: int, deadline_s: float | None = None,
              *, watch_first_token: bool = False) -> Admission:
        """`async with` this: yields a Ticket once the request may start; raises AdmissionRejected.

        With `watch_first_token` the caller promises Ticket.first_token() when the response's first token
        passes (a stream): the prefill gate then counts the request until then."""
        return Admission(self, (tenant, route_class, predicted_tokens, deadline_s, watch_first_token))

    async def acquire(self, tenant: str, route_class: RouteClass, predicted_tokens: int,
                      deadline_s: float | None = None, *, watch_first_token: bool = False) -> Ticket:
        """The Ticket without a context manager (for a stream that outlives the handler); release() it."""
        ticket = self.try_admit(tenant, route_class, predicted_tokens, watch_first_token=watch_first_token)
        if ticket is None:
            ticket = await self.wait(tenant, route_class, predicted_tokens, deadline_s,
                                     watch_first_token=watch_first_token)
        return ticket

    def try_admit(self, tenant: str, route_class: RouteClass, predicted_tokens: int, *,
                  watch_first_token: bool = False) -> Ticket | None:
        """A Ticket now when nothing waits and there is room, else None (then await wait())."""
        tenants = self._tenants  # None unless enabled is unset: then a pass-through while one tenant is served
        several = tenants is None or tenants.arrived(tenant, self._clock())
        if self.in_flight < self._open_below:  # below saturation (the same test as start_now)
            return self._start_fast(tenant, route_class, predicted_tokens)
        if tenants is None:
            if self.cfg.enabled is False:
                return self._grant(tenant, route_class, predicted_tokens, 0.0, False)
        elif not several:
            # Alone: nobody to be fair to, so no reserve, pacing, deadline or refusal. But past the engines' slots
            # its requests wait here, in arrival order, instead of in the engines' first-come first-served queue
            # (the same order for it): a tenant that comes next then finds the next free slot, not a backlog of
            # this one's requests that it cannot overtake (measured on 4 slots: 24 queued, 6 s).
            if self.limit is None and self.capacity is not None and self.in_flight >= self.capacity:
                self.limit = self.capacity
                self._refresh_fast()
            if len(self._sched) == 0 and (self.limit is None or self.in_flight < self.limit):
                return self._grant(tenant, route_class, predicted_tokens, 0.0, False)
            return None
        limit, capacity = self.limit, self.capacity
        if limit is None:
            if capacity is None or self.in_flight < capacity:
                # Uncapped (below saturation): no shares, reserve or pacing; only the token cap can hold it here.
                if len(self._sched) == 0 and self._room(tenant, predicted_tokens):
                    self._sched.serve_direct(tenant, predicted_tokens)
                    return self._grant(tenant, route_class, predicted_tokens, 0.0, False)
                return None
            # The engines hold no more: another request would wait in their first-come first-served queue
            # until the next scrape engaged the cap; engage it now (the scrape then re-sizes it).
            self.limit = limit = capacity
            self._refresh_fast()
        if self._under_share(tenant, limit):
            self._under_arrivals.add(self._clock())  # only while capped: the fast path pays nothing
        if len(self._sched) == 0 and self._room(tenant, predicted_tokens):
            self._sched.serve_direct(tenant, predicted_tokens)
            return self._grant(tenant, route_class, predicted_tokens, 0.0, False, watch_first_token)
        return None

    async def wait(self, tenant: str, route_class: RouteClass, predicted_tokens: int,
                   deadline_s: float | None = None, *, watch_first_token: bool = False) -> Ticket:
        """Queue the request until it may start; AdmissionRejected on a full queue or at the deadline."""
        deadline = self.cfg.deadline_s.for_class(route_class) if deadline_s is None else deadline_s
        loop = asyncio.get_running_loop()
        w = Waiter(tenant, route_class, predicted_tokens, loop.create_future(), self._clock(), watch_first_token)
        alone = self._alone()
        if alone and len(self._sched) >= self.cfg.max_queue_len:
            # A lone tenant is never refused: past the queue's bound its request goes to the engines' queue.
            return self._grant(tenant, route_class, predicted_tokens, 0.0, False)
        self._enqueue(w)
        self._refresh_fast()
        if not alone:  # a lone tenant's request waits as long as it would in the engine's queue
            w.timer = loop.call_later(max(deadline, 0.0), self._expire, w)
        self._pump()
        try:
            return await w.future
        except asyncio.CancelledError:
            self._abandon(w)
            raise

    def on_state_change(self, replicas: Iterable[ReplicaLoad]) -> Saturation:
        """Re-assess saturation from the pool's replicas in rotation (call after each scrape); may release waiters."""
        sat = assess(replicas, self.cfg, self.in_flight_tokens)
        self.saturation = sat
        if self._tenants is not None:
            self._tenants.prune(self._clock())
        if self.cfg.enabled is not False:
            self.capacity = learn_capacity(self.capacity, sat)
            self.limit = next_limit(self.limit, self.in_flight, len(self._sched), sat, self.cfg, self.capacity)
            self.reserve = self._demand_reserve(sat.replicas)
            self._pump()
            self._sched.forget_idle()
            self._recent.forget(self._clock())
        self._refresh_fast()
        return sat

    # --------------------------------------------------------------------------------------------- metrics
    @property
    def queue_len(self) -> int:
        """Requests waiting, all tenants."""
        return len(self._sched)

    def queue_lengths(self) -> dict[str, int]:
        """Requests waiting per tenant (tenants with none are absent)."""
        return {t: self._sched.backlog(t) for t in self._sched.backlogged()}

    def shares(self) -> dict[str, float]:
        """Each tenant's fraction of the tokens served through this queue so far."""
        total = sum(self.served_tokens.values())
        if total <= 0:
            return {}
        return {t: v / total for t, v in self.served_tokens.items()}

    def counters(self) -> dict[str, float]:
        """The virtual token counters (weighted service, lifted); their spread among waiting tenants = unfairness."""
        return dict(self._sched.counters)

    def retry_after_s(self, tenant: str, route_class: RouteClass) -> float:
        """When a new request of `tenant` might start: its place in the fair order over the recent release rate."""
        rate = self._releases.per_s(self._clock())
        if rate is None:
            return self.cfg.deadline_s.for_class(route_class)
        return max(self._sched.ahead_of_new(tenant) / rate, MIN_RETRY_AFTER_S)

    # ---------------------------------------------------------------------------------------------- inside
    def _demand_reserve(self, replicas: int) -> int:
        cfg, now, n = self.cfg, self._clock(), max(1, replicas)
        # Never more than a fraction of the cap: on a pool of 4 slots a reserve of 4 left the flood one slot.
        ceiling = cfg.reserve_max_per_replica * n
        if self.limit is not None:
            ceiling = min(ceiling, math.floor((self.capacity or self.limit) * cfg.reserve_max_fraction))
        return demand_reserve(self._under_arrivals.per_s(now), self._releases.per_s(now), cfg.reserve_miss,
                              cfg.reserve_per_replica * n, ceiling)

    def _alone(self) -> bool:
        """Fair only among several tenants (enabled unset) and one is served: its requests just keep their order."""
        return self._tenants is not None and not self._tenants.several()

    def _room(self, tenant: str, tokens: int) -> bool:
        limit = self.limit
        if limit is not None:
            if not self._alone() and not self._under_share(tenant, limit):
                if self._over_share_held_until() > self._clock() and not self._behind(tenant):
                    return False  # over its share and the last such start too recent, or not prefilled yet
                if self.reserve:
                    limit = max(limit - self.reserve, 1)  # the reserved slots are for tenants under their share
            if self.in_flight >= limit:
                return False
        cap = self.cfg.max_in_flight_tokens
        # One request always fits on an idle pool, however large: the cap must not refuse it forever.
        return cap is None or self.in_flight == 0 or self.in_flight_tokens + tokens <= cap

    def _under_share(self, tenant: str, limit: int) -> bool:
        """Fewer slots than its weighted share of `limit` among the tenants active (requests out or waiting), one
        more counted while only one is: the reserve is then for whoever comes next, even a flood's only neighbour."""
        sched = self._sched
        active = set(self.tenant_in_flight).union(sched.backlogged())
        active.add(tenant)
        total_w = sum(sched.weight(t) for t in active) + (self.cfg.default_weight if len(active) == 1 else 0.0)
        return self.tenant_in_flight.get(tenant, 0) * total_w < limit * sched.weight(tenant)

    def _behind(self, tenant: str) -> bool:
        """Below its weighted share of what the active tenants started lately (app.admission.recent)."""
        active = set(self.tenant_in_flight).union(self._sched.backlogged())
        active.add(tenant)
        return len(active) > 1 and self._recent.below_share(tenant, active, self._clock())

    def _over_share_held_until(self) -> float:
        """No over-share start before this: the pacing gap, and the prefill gate while it is full and the gateway
        holds a saturation threshold's worth of waiters (a sustained flood; a moment at the cap below saturation
        drains at once, as the engine's own queue would have drained it)."""
        cfg, replicas = self.cfg, max(1, self.saturation.replicas)
        if (not cfg.over_share_prefills_per_replica or not len(self._prefills)
                or len(self._sched) < cfg.max_waiting_per_replica * replicas):
            return self._paced_until
        allowed = cfg.over_share_prefills_per_replica * replicas
        return max(self._paced_until, self._prefills.held_until(self._clock(), allowed))

    def _grant(self, tenant: str, route_class: RouteClass, tokens: int, waited_s: float, queued: bool,
               watch: bool = False) -> Ticket:
        over = (self.limit is not None and not self._alone() and not self._under_share(tenant, self.limit)
                and not self._behind(tenant))
        self.in_flight += 1
        self.in_flight_tokens += tokens
        self.tenant_in_flight[tenant] = self.tenant_in_flight.get(tenant, 0) + 1
        self.served_tokens[tenant] = self.served_tokens.get(tenant, 0.0) + tokens
        if self.limit is not None:
            active = set(self.tenant_in_flight).union(self._sched.backlogged())
            self._recent.add(tenant, tokens, self._clock(), active)
        ticket = Ticket(self, tenant, route_class, tokens, waited_s, queued, over)
        if over:
            now = self._clock()
            if self.cfg.pace_over_share:
                self._paced_until = now + pace_gap_s(self._releases.per_s(now), self.cfg.pace_over_share)
            if watch and self.cfg.over_share_prefills_per_replica:
                self._prefills.start(ticket, now)
        return ticket

    def _first_token(self, ticket: Ticket) -> None:
        if ticket.over_share and self._prefills.done(ticket) and len(self._sched):  # only those enter the gate
            self._pump()

    def _release(self, ticket: Ticket) -> None:
        self.in_flight -= 1
        self.in_flight_tokens -= ticket.predicted_tokens
        left = self.tenant_in_flight[ticket.tenant] - 1
        if left:
            self.tenant_in_flight[ticket.tenant] = left
        else:
            del self.tenant_in_flight[ticket.tenant]
        self._releases.add(self._clock())
        if ticket.over_share:  # only over-share starts enter the prefill gate (_grant)
            self._prefills.done(ticket)
        if len(self._sched):
            self._pump()

    def _correct(self, tenant: str, delta: int) -> None:
        if delta == 0:
            return
        self.served_tokens[tenant] = self.served_tokens.get(tenant, 0.0) + delta
        if self.cfg.enabled is not False:
            self._sched.charge(tenant, delta)

    def _enqueue(self, w: Waiter) -> None:
        sched = self._sched
        if len(sched) >= self.cfg.max_queue_len:
            victim = sched.longest_other(w.tenant)
            if victim is None:
                raise self._rejection(w.tenant, w.route_class, "queue_full")
            else:
                entry = sched.newest(victim)
                assert entry is not None
                sched.remove(entry.tenant, entry.route_class, entry.item)
                self._fail(entry.item, "queue_full")
        sched.push(w.tenant, w.route_class, w, w.tokens)

    def _pump(self) -> None:
        sched = self._sched
        while len(sched):
            head = self._next()
            if head is None:
                self._arm_pace_timer()
                return
            sched.pop(head.tenant)
            w = head.item
            if w.future.done():  # cancelled; its task has not run its cleanup yet: undo the charge
                sched.charge(head.tenant, -head.cost)
                continue
            if w.timer is not None:
                w.timer.cancel()
            waited = self._clock() - w.enqueued_at
            self.waits.setdefault(w.tenant, WaitStats()).add(waited)
            if self._on_wait is not None:
                self._on_wait(w.tenant, w.route_class, waited)
            w.future.set_result(self._grant(w.tenant, w.route_class, w.tokens, waited, True, w.watch))
        self._refresh_fast()  # the backlog is empty

    def _arm_pace_timer(self) -> None:
        """Pump again when the pacing or the prefill gate lets the next over-share request start (one timer at
        a time, unless an earlier one is needed; a first token pumps by itself)."""
        due = self._over_share_held_until()
        delay = due - self._clock()
        if delay <= 0 or self.limit is None or self.in_flight >= self.limit:
            return
        if self._pace_timer is not None and self._pace_due <= due:
            return
        self._pace_due = due
        self._pace_timer = self._call_later(delay, self._on_pace_timer)

    def _on_pace_timer(self) -> None:
        self._pace_timer = None
        self._pace_due = 0.0
        if len(self._sched):
            self._pump()

    def _next(self) -> Entry[Waiter] | None:
        """The entry to start now: a tenant below its recent share first (app.admission.recent), else the fair
        order's head, else (the head held by the reserve or the pacing) a tenant under its share; None: wait."""
        head = self._sched.peek()
        assert head is not None
        if self.limit is not None and self.in_flight < self.limit:
            for t in self._sched.order():
                entry = self._sched.head_of(t)
                if entry is not None and self._behind(t) and self._room(t, entry.item.tokens):
                    return entry
        if self._room(head.tenant, head.item.tokens):
            return head
        return self._reserve_taker()

    def _reserve_taker(self) -> Entry[Waiter] | None:
        """The first waiting entry, in fair order, whose tenant may use the reserved or paced slots now."""
        if self.limit is None or self.in_flight >= self.limit:
            return None
        for t in self._sched.order():
            entry = self._sched.head_of(t)
            if entry is not None and self._room(t, entry.item.tokens):
                return entry
        return None

    def _expire(self, w: Waiter) -> None:
        if self._sched.remove(w.tenant, w.route_class, w):
            self._fail(w, "deadline")
            self._refresh_fast()

    def _fail(self, w: Waiter, reason: RejectReason) -> None:
        if w.timer is not None:
            w.timer.cancel()
        if not w.future.done():
            w.future.set_exception(self._rejection(w.tenant, w.route_class, reason, self._clock() - w.enqueued_at))

    def _rejection(self, tenant: str, route_class: RouteClass, reason: RejectReason,
                   waited_s: float = 0.0) -> AdmissionRejected:
        key = (tenant, reason)
        self.rejected[key] = self.rejected.get(key, 0) + 1
        return AdmissionRejected(self.retry_after_s(tenant, route_class), reason, tenant=tenant,
                                 route_class=route_class, waited_s=waited_s)

    def _abandon(self, w: Waiter) -> None:
        if w.timer is not None:
            w.timer.cancel()
        if self._sched.remove(w.tenant, w.route_class, w):
            self._refresh_fast()
            return
        if w.future.done() and not w.future.cancelled() and w.future.exception() is None:
            w.future.result().release()  # granted while the cancellation was on its way: hand the slot back
