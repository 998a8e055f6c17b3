"""Route on what each replica holds: vLLM's KV-cache events tell which blocks it has, the request's exact
block hashes tell which it needs; the pick minimises expected uncached prefill plus queueing.

cost(replica) = uncached prompt tokens there
              + load_tokens x requests beyond its capacity (queued in the engine), counting this one
              + in-flight requests (a tie-breaker of one token each)

so while a replica has free sequence slots its load costs (almost) nothing and the request goes where its
prefix is (pack while there is headroom); once slots run out each waiting request costs `load_tokens`
prefill-equivalent tokens and work spreads. Dynamo's KV router and llm-d's precise prefix scorer weigh the
same two terms. Any candidate whose event stream is not whole (never connected, gapped, stale) makes the
pick fall back to prefix affinity for that request: a partial index would call a warm replica cold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from app.config.policies import KvEventsParams
from app.routing.hashing import GOLDEN64, MASK64
from app.routing.policy import Policy, R, Selection

if TYPE_CHECKING:
    from app.records import PromptBlocks


class BlockView(Protocol):
    """What the policy needs of the event index (app.kvcache.subscriber.KvEventsHub)."""

    def is_whole(self, url: str) -> bool:
        """Whether this replica's event stream is complete."""
        ...

    def overlap_blocks(self, url: str, hashes: Sequence[int]) -> int:
        """Leading blocks of `hashes` the replica holds."""
        ...

    def note_request(self, url: str, expected_new_blocks: int) -> None:
        """A request expected to store new blocks went to `url` (staleness detection)."""
        ...

    def record_fallback(self) -> None:
        """A pick fell back to prefix affinity."""
        ...


class KvEvents:
    """The cost-based pick over the event index; `fallback` serves requests the index cannot judge."""

    name = "kv_events"

    def __init__(self, params: KvEventsParams, hub: BlockView, fallback: Policy) -> None:
        self.load_tokens = params.load_tokens
        self.hub = hub
        self.fallback = fallback

    def select(
        self, candidates: Sequence[R], key: int, blocks: PromptBlocks | None = None
    ) -> Selection[R]:
        """The cheapest replica by expected prefill + queueing; the runner-up is the second cheapest."""
        hub = self.hub
        if blocks is None or not blocks.hashes or not all(hub.is_whole(r.url) for r in candidates):
            hub.record_fallback()
            sel = self.fallback.select(candidates, key)
            return Selection(sel.chosen, sel.runner_up, "kv_fallback")
        n_tokens = blocks.n_tokens
        # The hashes' block size is the replicas' (app.kvcache.hashers resolves it before hashing).
        bs = blocks.block_size
        # vLLM always recomputes the last prompt token: at most (n-1)//block_size blocks can hit.
        max_hit = max((n_tokens - 1) // bs, 0)
        best: tuple[int, int] | None = None
        second: tuple[int, int] | None = None
        best_i = second_i = -1
        hits: list[int] = []
        for i, r in enumerate(candidates):
            hit = min(hub.overlap_blocks(r.url, blocks.hashes), max_hit)
            hits.append(hit)
            load = r.in_flight + r.external
            cap = r.capacity
            over = (load + 1 - cap if load + 1 > cap else 0) if cap else r.queued()
            cost = n_tokens - hit * bs + self.load_tokens * over + load
            rank = (cost, ((key ^ r.hash) * GOLDEN64) & MASK64)
            if best is None or rank < best:
                second, second_i = best, best_i
                best, best_i = rank, i
            elif second is None or rank < second:
                second, second_i = rank, i
        chosen = candidates[best_i]
        hit = hits[best_i]
        hub.note_request(chosen.url, len(blocks.hashes) - hit)
        runner_up = candidates[second_i] if second_i >= 0 else None
        return Selection(chosen, runner_up, "kv_hit" if hit else "kv_cold", hit * bs)
