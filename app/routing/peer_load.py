"""One load snapshot for every gateway process sharing a Store, so bounded load decides alike in all of them.

prefix_affinity sends a prefix to its home unless the home's load is over the bound. Each process used to
judge that on its own in-flight requests (exact) plus the others' as the last /metrics scrape saw them, and
the others' share is most of the load and changes faster than any scrape or sync interval (a request holds a
replica for ~100 ms to seconds): measured with three gateways, a third of the requests went to another replica
than an exact view would have chosen, half too eagerly to the home and half spilled needlessly, and
publishing counts every 100 ms and adding the others' latest to one's own live count did not help (the
others' part is as stale as before, one request lifetime). Any sum of "mine now + yours then" differs between
processes by exactly what changed in between.

So the processes stop mixing clocks: time is cut into rounds of `interval_s` on the wall clock (the gateways'
hosts are NTP-synced). At the start of round k each process publishes its per-replica in-flight counts,
tagged k, together with the counts it published in round k-1, and reads everyone's entry in the same store
round trip. From an entry tagged k it takes the k-1 counts, from one still tagged k-1 (that process has not
published k yet) its counts: either way every process's round k-1 counts, which were all published a round ago.
So every process, whenever in round k it reads, sums the same numbers into each replica's `shared_load`, and
its bound check runs on them for the round: the same prefix gets the same replica from all of them. The
price is that the bound sees requests one to two rounds late (a round adds its own arrivals to a home beyond
the bound). A process that sees no other process keeps its exact live view (`shared_load` -1), as does every
process while the store is unreachable or its round came more than a round late. Other clients of an engine
than these gateways are not in the snapshot: the bound counts the gateways' requests while it is in use.

Nothing here runs on the request path: one store round trip per round, from a background task.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

import orjson

from app.config import GatewayConfig
from app.routing.peer_load_config import PeerLoadSettings
from app.routing.state import ClusterState
from app.store.base import Store, StoreUnavailable

log = logging.getLogger(__name__)


def replica_field(pool: str, url: str) -> str:
    """The name a replica's count is published under: the same in every process with the same config."""
    return f"{pool} {url}"


def until_next_round(now: float, interval_s: float) -> float:
    """Seconds from `now` (wall clock) to the start of the next round: rounds start at multiples of the interval."""
    return interval_s - (now % interval_s)


def round_starting(now: float, interval_s: float) -> int:
    """The round a wake-up at a round's start begins: the nearest boundary's. uvloop's timers run on whole
    milliseconds and may fire a little before the boundary, where the clock still says the round before."""
    return round(now / interval_s)


def previous_round_counts(payload: str, current: int) -> dict[str, int] | None:
    """The round `current - 1` counts in a published payload, or None (an older round, or not a payload)."""
    try:
        doc = orjson.loads(payload)
        tag, counts, prev = doc["r"], doc["c"], doc["p"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    chosen = prev if tag == current else counts if tag == current - 1 else None
    if not isinstance(chosen, dict):
        return None
    return {k: v for k, v in chosen.items() if isinstance(v, int) and v > 0}


class PeerLoad:
    """Publishes this process's in-flight counts each round and applies everyone's counts of the round before."""

    def __init__(
        self,
        store: Store,
        cluster: Callable[[], ClusterState],
        settings: PeerLoadSettings,
        process_id: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        # A callable: discovery replaces the cluster state, and the next round must see the new one.
        self.cluster = cluster
        self.settings = settings
        self.process_id = process_id or uuid.uuid4().hex
        self.clock = clock
        self._last: tuple[int, dict[str, int]] = (-1, {})  # the round this process last published, and its counts
        self._warned = False
        self._in_force = -1  # the round whose counts are in every replica's shared_load; -1: the live view
        cluster().peer_clock = self.stamp if settings.route_header else None

    def stamp(self) -> str | None:
        """The route header's note: the snapshot in force now, and when."""
        return f"snapshot={self._in_force};decided={self.clock():.4f}"

    @classmethod
    def for_config(cls, cfg: GatewayConfig, store: Store, cluster: Callable[[], ClusterState]) -> PeerLoad | None:
        """Sharing where processes can share (a Store URL is configured) and it is enabled; else None."""
        if cfg.store.url is None or not cfg.routing.peer_load.enabled:
            return None
        return cls(store, cluster, cfg.routing.peer_load)

    def round_now(self) -> int:
        """The current round's number."""
        return int(self.clock() // self.settings.interval_s)

    async def exchange(self, current: int) -> bool:
        """Round `current`: publish this process's counts, set every replica's `shared_load` to everyone's round
        `current - 1` sum; False (and every `shared_load` -1, the live view) if the store is down or no other
        process is there."""
        mine = {replica_field(r.pool, r.url): r.in_flight for r in self.cluster().replicas() if r.in_flight}
        last_round, last = self._last
        payload = orjson.dumps({"r": current, "c": mine, "p": last if last_round == current - 1 else {}}).decode()
        self._last = (current, mine)
        try:
            everyone = await self.store.share_load(self.process_id, payload, self.settings.ttl_s)
        except StoreUnavailable as err:
            self._unavailable(err)
            everyone = {}
        if not any(pid != self.process_id for pid in everyone):
            self.stale()
            return False
        self._warned = False
        totals: dict[str, int] = {}
        for raw in everyone.values():
            for name, n in (previous_round_counts(raw, current) or {}).items():
                totals[name] = totals.get(name, 0) + n
        for r in self.cluster().replicas():
            r.shared_load = totals.get(replica_field(r.pool, r.url), 0)
        self._in_force = current - 1
        return True

    def stale(self) -> None:
        """No snapshot every process shares this round: back to the live view until the next."""
        for r in self.cluster().replicas():
            r.shared_load = -1
        self._in_force = -1

    async def run(self) -> None:
        """One exchange at the start of every round, until cancelled."""
        while True:
            await asyncio.sleep(until_next_round(self.clock(), self.settings.interval_s))
            try:
                current = round_starting(self.clock(), self.settings.interval_s)
                await self.exchange(current)
                if self.round_now() > current:  # a slow store or a busy loop: the others are a round further
                    self.stale()
            except Exception:  # a bug here must not end sharing silently for the process's life
                log.exception("peer load: round failed")
                self.stale()

    def _unavailable(self, err: StoreUnavailable) -> None:
        if not self._warned:  # once per outage
            log.warning("peer load: store unavailable (%s); bounded load uses this process's own view", err)
            self._warned = True
