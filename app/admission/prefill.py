"""Over-share starts still waiting for their first token: at most a few per replica while the pool is capped.

A request the gateway has started but not yet seen a first token of is, on a full engine, a prefill that is
queued or running. Pacing by the release rate alone spaces starts on the gateway's clock, not the engine's:
with the gap close to one prefill's cost in the batch (h100-8b: ~18.6 ms per extra 512-token prefill, pacing
at 2x ~27 releases/s = 18.5 ms), a step holding k prefills lasts long enough for about k more to arrive, so
the number of prefills per step random-walks up to 5-7, and a light request that lands among them waits for
all of them, twice (the step in flight, then its own). Holding the flood's next start until its previous one
has produced a token bounds what a step can hold to the gate's size, whatever the engine's step time; the
streams' first tokens are what the gateway sees of the engine's steps.

A start counts for at most `hold_s` (a first token never seen: the upstream is slow, or the gateway did not
watch this request), so the gate delays the flood and never stops it.
"""

from __future__ import annotations


class PrefillGate:
    """Started over-share requests without a first token yet, oldest first, each counted for `hold_s` at most."""

    __slots__ = ("_hold_s", "_started")

    def __init__(self, hold_s: float) -> None:
        self._hold_s = hold_s
        self._started: dict[object, float] = {}  # insertion order = start order (one clock, never goes back)

    def __len__(self) -> int:
        return len(self._started)

    def start(self, key: object, now: float) -> None:
        """A watched over-share request started at `now`."""
        self._started[key] = now

    def done(self, key: object) -> bool:
        """Its first token came (or it ended): True when it was still counted."""
        return self._started.pop(key, None) is not None

    def held_until(self, now: float, allowed: int) -> float:
        """0 when another start may go now, else when the oldest counted start stops counting."""
        started = self._started
        while started:
            key, at = next(iter(started.items()))
            if at + self._hold_s > now:
                break
            del started[key]
        if len(started) < allowed:
            return 0.0
        return next(iter(started.values())) + self._hold_s
