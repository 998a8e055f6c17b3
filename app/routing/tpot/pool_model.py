"""What the TPOT router knows of one pool, fed by the deltas of its replicas' scraped counters.

Nothing here polls: the scraper already stores each replica's counters after every scrape (ReplicaState.counters,
a new dict each time). The first pick after a scrape notices the new `last_scrape` and takes the deltas since the
scrape before (one float comparison per replica per pick otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from app.routing import promtext as m
from app.routing.state import ReplicaState
from app.routing.tpot.acceptance import PoolAcceptance
from app.routing.tpot.step_fit import StepFit

# Prefill seconds per uncached prompt token before the pool's own counters say (an H100 at 8B: ~36 µs).
DEFAULT_PREFILL_S_PER_TOKEN = 4e-5
PREFILL_ALPHA = 0.2
# Decode lifetime (Little: Δ itl sum / Δ requests that reached their first token) from sums that decay by this per
# interval; the batch level averages over LEVEL_LIFETIMES of those lifetimes.
LIFETIME_DECAY = 0.8
LEVEL_LIFETIMES = 2.0


class BatchLevel:
    """One replica's decode batch as its scrapes saw it: the level it has averaged lately and how long a sequence
    stays in it. A request's batch reverts from what it is at the pick toward this level over its life (the
    requests in flight finish, new ones arrive at the rate that made the level), see predict.expected_batch."""

    __slots__ = ("_seq_s", "_started", "level", "lifetime_s")

    def __init__(self, batch: float) -> None:
        self.level = batch
        self.lifetime_s = 0.0  # 0: unknown (no first-token counts), the batch at the pick is used as it is
        self._seq_s = self._started = 0.0

    def add(self, dt: float, batch: float, seq_s: float, started: float) -> None:
        """One interval of `dt` s: its time-averaged decode batch, Σ decode seconds and first tokens."""
        self._seq_s = self._seq_s * LIFETIME_DECAY + seq_s
        self._started = self._started * LIFETIME_DECAY + started
        if self._started > 0.5:
            self.lifetime_s = self._seq_s / self._started
        tau = max(LEVEL_LIFETIMES * self.lifetime_s, dt)
        w = math.exp(-dt / tau)
        self.level = w * self.level + (1.0 - w) * batch


def _delta(prev: Mapping[str, float], cur: Mapping[str, float], name: str) -> float:
    # 0 on a missing series or a counter reset (the replica restarted): that interval teaches nothing.
    if name not in prev or name not in cur:
        return 0.0
    d = cur[name] - prev[name]
    return d if d > 0 else 0.0


class PoolModel:
    """One pool's step-time fit, acceptance and prefill speed; `refresh` takes in new scrapes."""

    __slots__ = (
        "_seen", "acceptance", "clock", "fit", "intervals", "last_decode", "levels", "name",
        "prefill_s_per_token", "speculative",
    )

    def __init__(self, name: str, *, speculative: bool, window: int, prior_streams: float) -> None:
        self.name = name
        # Configured (pools.<p>.speculative), or seen: a replica that publishes spec-decode counters speculates.
        self.speculative = speculative
        self.fit = StepFit(window)
        self.acceptance = PoolAcceptance(prior_streams)
        self.prefill_s_per_token = DEFAULT_PREFILL_S_PER_TOKEN
        self.intervals = 0  # scrape intervals that had decode steps
        # Scrape clock (ReplicaState.last_scrape) of the newest scrape seen, and of the newest interval with decode
        # steps: the router probes a pool it avoids once its data is older than `routing.tpot.stale_s`.
        self.clock = 0.0
        self.last_decode = 0.0
        self._seen: dict[str, tuple[float, Mapping[str, float]]] = {}
        self.levels: dict[str, BatchLevel] = {}  # replica url -> its recent decode batch and sequence lifetime

    def refresh(self, replicas: Iterable[ReplicaState]) -> None:
        """Take in every replica's scrape newer than the last one seen."""
        for r in replicas:
            seen = self._seen.get(r.url)
            if seen is None or seen[0] != r.last_scrape:
                if r.last_scrape:
                    self._seen[r.url] = (r.last_scrape, r.counters)
                    self.clock = max(self.clock, r.last_scrape)
                if seen is not None and r.counters:
                    self._ingest(r.url, r.last_scrape, r.last_scrape - seen[0], seen[1], r.counters)

    def _ingest(self, url: str, now: float, dt: float, prev: Mapping[str, float], cur: Mapping[str, float]) -> None:
        if dt <= 0:
            return
        if cur.get(m.ITL_COUNT, 0.0) < prev.get(m.ITL_COUNT, 0.0):
            # A counter went back: the engine restarted, maybe with other flags. What it did before says nothing
            # of it now; the router stands aside until this pool has `min_samples` new intervals.
            self.fit.clear()
            self.intervals = 0
            self.levels.pop(url, None)
            return
        itl_sum = _delta(prev, cur, m.ITL_SUM)
        steps = _delta(prev, cur, m.ITL_COUNT)
        level = self.levels.get(url)
        if level is None:
            level = self.levels[url] = BatchLevel(itl_sum / dt)
        level.add(dt, itl_sum / dt, itl_sum, _delta(prev, cur, m.TTFT_COUNT))
        if steps > 0 and itl_sum > 0:
            # Σ over steps of (decoding sequences x step time) / wall time = the time-averaged decode batch.
            self.fit.add(itl_sum / dt, itl_sum / steps)
            self.intervals += 1
            self.last_decode = now
        if m.SPEC_DRAFT_TOKENS in cur:
            self.speculative = True
            accepted = _delta(prev, cur, m.SPEC_ACCEPTED)
            self.acceptance.add_counters(accepted, steps, _delta(prev, cur, m.SPEC_DRAFT_TOKENS))
        uncached = _delta(prev, cur, m.PROMPT_TOKENS) - _delta(prev, cur, m.PROMPT_TOKENS_CACHED)
        prefill = _delta(prev, cur, m.PREFILL_TIME_SUM)
        if uncached > 0 and prefill > 0:
            self.prefill_s_per_token += PREFILL_ALPHA * (prefill / uncached - self.prefill_s_per_token)

    def ready(self, min_samples: int) -> bool:
        """Enough intervals with decode steps for the fit to be used."""
        return self.intervals >= min_samples

    def stale(self, now: float, stale_s: float) -> bool:
        """No interval with decode steps for `stale_s` up to `now` (the scrape clock): what the fit says of this
        pool is what it was when it last had traffic."""
        return now - self.last_decode > stale_s

    def tokens_per_step(self, tenant: str, kind: str) -> float:
        """Tokens per decode step for this tenant's request of this kind (1 on a pool that does not speculate)."""
        return self.acceptance.expected(tenant, kind) if self.speculative else 1.0
