"""Tokens per decode step (mean acceptance length) on a speculative pool: for the pool, per kind, per tenant.

The pool's number comes from its engines' counters: every decode step of a sequence is one inter-token-latency
observation and yields 1 + its accepted draft tokens, so tokens per step = 1 + Δaccepted / Δitl_count (all
requests, any client). Who accepts more is learned from the gateway's own streams: a stream relays one event per
engine step, so (completion tokens - 1) / (content events - 1) is that stream's tokens per step. Streams are
read relative to the pool's stream average, and that ratio scales the counter figure, so an API server that
coalesces events under load (vLLM merges outputs a slow reader has not taken) biases nothing. Estimates shrink
toward the level above (tenant → kind → pool) with `prior_streams` pseudo-streams. Counts only, no content.
"""

from __future__ import annotations

from collections import OrderedDict

# Counter sums decay by this per scrape interval of one replica: the pool figure follows the last ~10 intervals.
COUNTER_DECAY = 0.9
# A stream average weighs new streams 1/n until this many, then by 1/this (recent behaviour dominates).
STREAM_HORIZON = 200
MAX_TOKENS_PER_STEP = 16.0


class Mean:
    """A running mean that forgets slowly: (count, mean)."""

    __slots__ = ("mean", "n")

    def __init__(self) -> None:
        self.n = 0.0
        self.mean = 0.0

    def add(self, value: float) -> None:
        """One observation."""
        self.n += 1.0
        self.mean += (value - self.mean) / min(self.n, STREAM_HORIZON)

    def shrunk(self, prior: float, strength: float) -> float:
        """The mean pulled toward `prior` as if `strength` observations of it came first."""
        n = min(self.n, STREAM_HORIZON)
        return (n * self.mean + strength * prior) / (n + strength)


class StepMean:
    """Tokens per step over the streams that ended lately, as the counters count it: Σ tokens / Σ steps (a long
    stream weighs by its steps), decayed on the counters' clock (`decay`, once per replica interval) so that it
    covers the same recent traffic as the pool figure it is compared with. A mean of per-stream ratios over the
    last 200 streams was neither: when the router moved chat (1.4 tokens per step) off a pool that kept code
    (3.7), the counters saw the new mix within seconds and the stream mean still held the old one, and code's
    estimate came out 5-9 % off (experiments/tpot_model_eval.py --diagnose)."""

    __slots__ = ("_steps", "_tokens", "n")

    def __init__(self) -> None:
        self.n = 0.0
        self._tokens = self._steps = 0.0

    def add(self, tokens_per_step: float, steps: float) -> None:
        """One stream's tokens per step over its `steps` steps."""
        self.n += 1.0
        self._tokens += tokens_per_step * steps
        self._steps += steps

    def decay(self) -> None:
        """One replica interval passed (as the counter sums decay)."""
        self._tokens *= COUNTER_DECAY
        self._steps *= COUNTER_DECAY

    @property
    def mean(self) -> float:
        """The step-weighted mean (0 before any stream)."""
        return self._tokens / self._steps if self._steps > 0 else 0.0


class PoolAcceptance:
    """One pool's acceptance: counter sums (all traffic) and stream means (this gateway's), bounded in keys."""

    __slots__ = (
        "_accepted", "_draft_tokens", "_expected", "_keys", "_kinds", "_max_keys", "_steps", "_strength", "streams",
    )

    def __init__(self, prior_streams: float = 8.0, max_keys: int = 4096) -> None:
        self._accepted = self._steps = self._draft_tokens = 0.0
        self._strength = prior_streams
        self._max_keys = max_keys
        self.streams = StepMean()  # every stream relayed from this pool, as the counters weigh it
        self._kinds: dict[str, Mean] = {}
        self._keys: OrderedDict[tuple[str, str], Mean] = OrderedDict()
        # expected() per (tenant, kind) until the next observation: picks between two settles hit this.
        self._expected: dict[tuple[str, str], float] = {}

    def add_counters(self, accepted: float, steps: float, draft_tokens: float) -> None:
        """One replica interval's Δaccepted, Δ decode steps (itl count) and Δ draft tokens."""
        self._expected.clear()
        self._accepted = self._accepted * COUNTER_DECAY + accepted
        self._steps = self._steps * COUNTER_DECAY + steps
        self._draft_tokens = self._draft_tokens * COUNTER_DECAY + draft_tokens
        self.streams.decay()

    def tokens_per_step(self) -> float:
        """The pool's mean tokens per decode step (1 until its counters said otherwise)."""
        return 1.0 + self._accepted / self._steps if self._steps > 0 else 1.0

    def rate(self) -> float | None:
        """Accepted / proposed draft tokens (vLLM's acceptance rate), None before any draft."""
        return self._accepted / self._draft_tokens if self._draft_tokens > 0 else None

    def add_stream(self, tenant: str, kind: str, tokens_per_event: float, steps: float = 1.0) -> None:
        """One finished stream of `tenant`'s request of `kind` on this pool, over `steps` decode steps (events)."""
        if not 0.0 < tokens_per_event <= MAX_TOKENS_PER_STEP or steps <= 0:
            return
        self._expected.clear()
        self.streams.add(tokens_per_event, steps)
        self._kinds.setdefault(kind, Mean()).add(tokens_per_event)
        key = (tenant, kind)
        found = self._keys.get(key)
        if found is None:
            if len(self._keys) >= self._max_keys:
                self._keys.popitem(last=False)
            found = self._keys[key] = Mean()
        else:
            self._keys.move_to_end(key)
        found.add(tokens_per_event)

    def expected(self, tenant: str, kind: str) -> float:
        """Tokens per decode step a request of `tenant` and `kind` will see here."""
        key = (tenant, kind)
        found = self._expected.get(key)
        if found is None:
            found = self._expected[key] = self._estimate(tenant, kind)
        return found

    def _estimate(self, tenant: str, kind: str) -> float:
        base = self.tokens_per_step()
        ref = self.streams
        if ref.n == 0:
            return base
        by_kind = self._kinds.get(kind)
        ref_mean = ref.mean
        level = by_kind.shrunk(ref_mean, self._strength) if by_kind is not None else ref_mean
        own = self._keys.get((tenant, kind))
        if own is not None:
            level = own.shrunk(level, self._strength)
        return min(max(base * level / ref_mean, 1.0), MAX_TOKENS_PER_STEP)

    def by_key(self) -> list[tuple[str, str, float]]:
        """(tenant, kind, expected tokens per step) for every key seen, for /metrics."""
        return [(t, k, self.expected(t, k)) for t, k in list(self._keys)]
