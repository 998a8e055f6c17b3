"""One load snapshot for every gateway process sharing a Store, in force in all of them at the same instant, so
bounded load decides alike in all of them.

prefix_affinity sends a prefix to its home unless the home's load is over the bound. Each process used to
judge that on its own in-flight requests (exact) plus the others' as the last /metrics scrape saw them, and
the others' share is most of the load and changes faster than any scrape or sync interval (a request holds a
replica for ~100 ms to seconds): measured with three gateways, a third of the requests went to another replica
than an exact view would have chosen, and publishing counts every 100 ms and adding the others' latest to one's
own live count did not help (the others' part is as stale as before, one request lifetime). Any sum of "mine now
+ yours then" differs between processes by exactly what changed in between.

So the processes stop mixing clocks. Time is cut into rounds of `interval_s`. In the middle of every round each
process publishes its per-replica in-flight counts and reads everyone's in one store round trip; the store
stamps each publication with its own clock, so which round a publication belongs to is the store's one answer,
not each host's. Each publication carries the process's previous two with their stamps, so from any entry a
reader finds that process's last counts of the round before the store's current one; and once the store's clock
is past a round nothing more can be published in it: every read during round k yields the same sums of
everyone's round k-1 counts, snapshot k-1. A process schedules it to come into force at the start of round k+1
on the store's clock, and pick brings it in lazily, comparing that clock with that instant: every process changes
snapshot at the same instant however late its event loop ran the exchange, as long as the exchange returned
within the half round before. In round n every process decides on snapshot n-2 (counts 1.5 to 2.5 rounds old:
the price of agreeing).

The store's clock, not the host's: with each host's own clock a skew d between two hosts splits d of every round
between two snapshots (20 ms of a 100 ms round: a fifth of the picks), and NTP leaves ms to tens of ms. Every
exchange's reply carries the store's clock, so each process estimates its offset to it (store_clock.py: the
midpoint of the round trip, off by at most half of it, from the shortest of the last eight) and reads the store's
clock as its own plus that offset: one clock read and one addition per pick. The offset is 0 until the first
exchange, and it moves only at exchanges: however it steps, a snapshot comes into force once and none is skipped
(a pending one is applied once, and before the step if it was due by then); a step only moves this process's
switch instants by its size (within a round trip once estimated; the whole skew at the first exchange). Measured
(experiments/peer_load_skew.py, docs/deploy.md): the same snapshot in every process in 99.8-100 % of instants
with hosts skewed by up to ±45 ms (on the hosts' own clocks: ~10 % at ±45 ms, ~90 % at ±5 ms).

A round whose snapshot did not arrive in time (store slow or down, loop stalled) keeps the last one for one more
round, then the live view: the same instants in every process the store failed for. A process that finds no
other process published in the snapshot's round keeps its exact live view (`shared_load` -1) from the next round
on. Other clients of an engine than these gateways are not in the snapshot: the bound counts the gateways'
requests while it is in use.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple

import orjson
from opentelemetry.metrics import Meter, Observation

from app.cancel import raise_if_cancelled
from app.config import GatewayConfig
from app.config.peer_load import PeerLoadSettings
from app.routing.state import ClusterState
from app.routing.store_clock import StoreClock
from app.store.base import Store, StoreUnavailable
from app.telemetry import instruments as ins

log = logging.getLogger(__name__)

# Where in its round a process exchanges: half a round before the switch is its margin for a busy event loop or a
# slow store round trip; earlier would make the counts older still.
PHASE = 0.5
EXCHANGE_OUTCOMES = ("shared", "alone", "late", "store_unavailable", "failed")
HISTORY = 2  # earlier publications each carries: a process publishes once a round, at most twice around a stall


class Pending(NamedTuple):
    """A snapshot waiting for its instant `at` (store clock, s): the round of its counts, its per-replica sums
    (None: alone), and when it gives way to the live view if no newer one came (one round after its own)."""

    at: float
    round: int
    totals: dict[str, int] | None
    expires: float


def replica_field(pool: str, url: str) -> str:
    """The name a replica's count is published under: the same in every process with the same config."""
    return f"{pool} {url}"


def until_exchange(now: float, interval_s: float) -> float:
    """Seconds from `now` (the store's clock) to the next exchange: PHASE into every round."""
    return (PHASE * interval_s - now) % interval_s


def counts_of_round(written_us: int, payload: str, round_: int, interval_us: int) -> dict[str, int] | None:
    """A process's last counts published in `round_` (by the store's stamps), or None (none then, not a payload)."""
    try:
        doc = orjson.loads(payload)
        history = [(written_us, doc["c"]), *doc["h"]]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    for entry in history:
        if not isinstance(entry, tuple | list) or len(entry) != 2 or not isinstance(entry[0], int):
            return None
        if entry[0] // interval_us == round_:
            counts = entry[1]
            if not isinstance(counts, dict):
                return None
            return {k: v for k, v in counts.items() if isinstance(v, int) and v > 0}
    return None


class PeerLoad:
    """Publishes this process's in-flight counts each round; brings everyone's of a round into force two later."""

    def __init__(
        self,
        store: Store,
        cluster: Callable[[], ClusterState],
        settings: PeerLoadSettings,
        process_id: str = "",
        clock: Callable[[], float] = time.time,
        on_store_clock: bool = True,
    ) -> None:
        self.store = store
        # A callable: discovery replaces the cluster state, and the next snapshot must land in the new one.
        self.cluster = cluster
        self.settings = settings
        self.interval_us = max(round(settings.interval_s * 1_000_000), 1)
        self.process_id = process_id or uuid.uuid4().hex
        self.clock = clock
        # Rounds are on the store's clock, read as the local one plus `offset` (its estimate from the exchanges'
        # round trips). Off: the local clock as it is (offset 0), hosts assumed in sync: the measured baseline.
        self.store_clock = StoreClock() if on_store_clock else None
        self.offset = 0.0
        self._history: list[tuple[int, dict[str, int]]] = []  # this process's last publications: (store µs, counts)
        self._pending: Pending | None = None
        self._in_force = -1  # the round whose counts are in every replica's shared_load; -1: the live view
        self._expires = math.inf  # when the snapshot in force gives way to the live view if no newer one came
        self._next_at = math.inf  # the next instant pick must act at: min(pending's, expiry)
        self._warned = False
        self.exchanges = dict.fromkeys(EXCHANGE_OUTCOMES, 0)  # for /metrics
        self.processes = 0  # in the last snapshot, this one included (0: none yet, or the store was down)
        cluster().peer_clock = self.stamped if settings.route_header else self.due

    @classmethod
    def for_config(
        cls, cfg: GatewayConfig, store: Store, cluster: Callable[[], ClusterState], meter: Meter | None = None
    ) -> PeerLoad | None:
        """Sharing where processes can share (a Store URL is configured) and it is enabled, its metrics on
        `meter`; else None."""
        if cfg.store.url is None or not cfg.routing.peer_load.enabled:
            return None
        peer_load = cls(store, cluster, cfg.routing.peer_load)
        if meter is not None:
            peer_load.register_metrics(meter)
        return peer_load

    # --- the pick path ---------------------------------------------------------------------------------

    def due(self) -> None:
        """Before a pick: bring the snapshot due by now into force (one clock read; nothing else most picks)."""
        now = self.clock() + self.offset
        if now >= self._next_at:
            self._advance(now)

    def stamped(self) -> str | None:
        """`due`, and the route header's note: the round of the snapshot that decides, and when (store clock)."""
        now = self.clock() + self.offset
        if now >= self._next_at:
            self._advance(now)
        return f"snapshot={self._in_force};decided={round(now * 1_000_000)}"  # µs: rounds split on exact integers

    def now(self) -> float:
        """The store's clock as this process reads it (s): the one the rounds are on."""
        return self.clock() + self.offset

    def in_force(self) -> int:
        """The round whose counts decide now (-1: the live view)."""
        self.due()
        return self._in_force

    def _advance(self, now: float) -> None:
        p = self._pending
        if p is not None and now >= p.at:
            self._pending = None
            self._apply(p.round, p.totals)
            self._expires = p.expires if p.totals is not None else math.inf
        if now >= self._expires:
            self._apply(-1, None)
            self._expires = math.inf
        self._next_at = min(self._pending.at if self._pending is not None else math.inf, self._expires)

    def _apply(self, round_: int, totals: dict[str, int] | None) -> None:
        for r in self.cluster().replicas():
            r.shared_load = -1 if totals is None else totals.get(replica_field(r.pool, r.url), 0)
        self._in_force = -1 if totals is None else round_

    # --- the background exchange -----------------------------------------------------------------------

    async def exchange(self) -> Pending | None:
        """Publish this process's counts; schedule everyone's counts of the store's previous round for the start
        of its next round (totals None: no other process is there, the live view from then on). None if the
        store is down."""
        mine = {replica_field(r.pool, r.url): r.in_flight for r in self.cluster().replicas() if r.in_flight}
        payload = orjson.dumps({"c": mine, "h": self._history}).decode()
        sent = self.clock()
        try:
            now_us, everyone = await self.store.share_load(self.process_id, payload, self.settings.ttl_s)
        except StoreUnavailable as err:
            self._unavailable(err)
            self.exchanges["store_unavailable"] += 1
            return None  # the snapshot in force expires on its own: at the same instant wherever the store failed
        received = self.clock()
        self._warned = False
        if self.store_clock is not None:
            # What was due by the reading before the step comes in first: a step back skips no snapshot.
            self.due()
            self.offset = self.store_clock.sample(sent, now_us / 1_000_000, received)
        self._history = [(now_us, mine), *self._history[: HISTORY - 1]]
        current = now_us // self.interval_us
        # In force from the start of the next round, and for one more round if the next snapshot is late.
        at, expires = ((current + n) * self.interval_us / 1_000_000 for n in (1, 3))
        totals: dict[str, int] = {}
        published = set()  # who published in that round: fixed once it is over, like the counts
        for pid, (written_us, raw) in everyone.items():
            counts = counts_of_round(written_us, raw, current - 1, self.interval_us)
            if counts is None:
                continue
            published.add(pid)
            for name, n in counts.items():
                totals[name] = totals.get(name, 0) + n
        others = bool(published - {self.process_id})
        self.processes = len(published | {self.process_id})
        # Late: the instant every process switches at has passed here, so this one switches after the others.
        self.exchanges["late" if others and self.now() >= at else "shared" if others else "alone"] += 1
        return self._schedule(Pending(at, current - 1, totals if others else None, expires))

    def _schedule(self, pending: Pending) -> Pending:
        now = self.now()
        if now >= self._next_at:  # the one pending (the last round's) is due: it has its turn first
            self._advance(now)
        self._pending = pending
        self._next_at = min(pending.at, self._expires)
        return pending

    def stale(self) -> None:
        """No snapshot every process shares: the live view now, until the next one comes into force."""
        self._pending = None
        self._apply(-1, None)
        self._expires = self._next_at = math.inf

    async def run(self) -> None:
        """One exchange in the middle of every round, until cancelled."""
        while True:
            await asyncio.sleep(until_exchange(self.now(), self.settings.interval_s))
            try:
                await self.exchange()
            except Exception:  # a bug here must not end sharing silently for the process's life
                log.exception("peer load: round failed")
                self.exchanges["failed"] += 1
                self.stale()
            raise_if_cancelled()  # the store's client may have swallowed a stop

    def register_metrics(self, meter: Meter) -> None:
        """Processes in the last snapshot, whether a shared one decides, exchanges by outcome, the clock offset."""
        ins.observe(meter, ins.PEER_LOAD_PROCESSES, lambda o: [Observation(self.processes)])
        ins.observe(meter, ins.PEER_LOAD_IN_FORCE, lambda o: [Observation(int(self._in_force >= 0))])
        ins.observe(meter, ins.PEER_LOAD_EXCHANGES,
                    lambda o: [Observation(n, {"outcome": k}) for k, n in self.exchanges.items()])
        ins.observe(meter, ins.PEER_LOAD_CLOCK_OFFSET, lambda o: [Observation(self.offset)])

    def _unavailable(self, err: StoreUnavailable) -> None:
        if not self._warned:  # once per outage
            log.warning("peer load: store unavailable (%s); bounded load uses this process's own view", err)
            self._warned = True
