"""Which replica holds which KV block: block hash → replicas, per medium, bounded.

Kept per replica (an insertion-ordered map hash → medium bits): a request's overlap on one replica is then
a walk of plain dict lookups, and `AllBlocksCleared` or a restart drops one map in O(1). The capacity is
per replica and evicts the least recently *stored* block: it is a memory bound for when removals were
missed (a gap that replay could not fill), not a model of vLLM's own LRU, so it only ever under-predicts.
KV-cache groups (hybrid models) share one namespace here: single-group models are the supported case.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Final

MEDIUM_BITS: Final = {"GPU": 1, "CPU": 2}
_OTHER_MEDIUM: Final = 4  # STORAGE or any tier vLLM adds later
ANY_MEDIUM: Final = 7


def medium_bit(medium: str | None) -> int:
    """The bit for a vLLM medium name (None, as vLLM publishes without offloading, means GPU)."""
    if medium is None:
        return 1
    return MEDIUM_BITS.get(medium.upper(), _OTHER_MEDIUM)


class KvIndex:
    """Bounded block-hash index over many replicas; not thread-safe (one event loop owns it)."""

    def __init__(self, capacity_blocks: int = 262_144) -> None:
        if capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be positive")
        self.capacity_blocks = capacity_blocks
        self._blocks: dict[str, OrderedDict[int, int]] = {}
        self.evictions = 0

    def _replica(self, replica: str) -> OrderedDict[int, int]:
        blocks = self._blocks.get(replica)
        if blocks is None:
            blocks = self._blocks[replica] = OrderedDict()
        return blocks

    def store(self, replica: str, hashes: Iterable[int], medium: str | None = None) -> None:
        """Record blocks as cached on `replica` in `medium`."""
        bit = medium_bit(medium)
        blocks = self._replica(replica)
        for h in hashes:
            prev = blocks.get(h)
            if prev is None:
                blocks[h] = bit
            else:
                blocks[h] = prev | bit
                blocks.move_to_end(h)
        excess = len(blocks) - self.capacity_blocks
        for _ in range(max(0, excess)):
            blocks.popitem(last=False)
        if excess > 0:
            self.evictions += excess

    def remove(self, replica: str, hashes: Iterable[int], medium: str | None = None) -> None:
        """Forget blocks evicted from `medium` on `replica` (unknown hashes are ignored)."""
        blocks = self._blocks.get(replica)
        if not blocks:
            return
        keep = ~medium_bit(medium)
        for h in hashes:
            prev = blocks.get(h)
            if prev is None:
                continue
            left = prev & keep
            if left:
                blocks[h] = left
            else:
                del blocks[h]

    def clear(self, replica: str) -> None:
        """Forget everything about `replica` (AllBlocksCleared, restart, unrecoverable gap)."""
        self._blocks.pop(replica, None)

    def overlap(self, replica: str, hashes: Sequence[int], medium: str | None = None) -> int:
        """Number of leading `hashes` cached on `replica` (chained hashes: stop at the first miss).

        `medium=None` counts a block held in any medium (a CPU-offloaded block is loaded, not recomputed).
        """
        blocks = self._blocks.get(replica)
        if not blocks:
            return 0
        n = 0
        if medium is None:
            for h in hashes:
                if h not in blocks:
                    break
                n += 1
            return n
        bit = medium_bit(medium)
        get = blocks.get
        for h in hashes:
            if not get(h, 0) & bit:
                break
            n += 1
        return n

    def size(self, replica: str | None = None) -> int:
        """Blocks indexed for one replica, or over all replicas."""
        if replica is not None:
            blocks = self._blocks.get(replica)
            return len(blocks) if blocks else 0
        return sum(len(b) for b in self._blocks.values())

    def replicas(self) -> list[str]:
        """Replicas that have at least one indexed block."""
        return [r for r, b in self._blocks.items() if b]
