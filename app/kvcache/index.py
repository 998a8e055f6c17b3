"""Which replica holds which KV block: block hash → replicas, per medium, bounded.

Kept per replica (an insertion-ordered map hash → copies per medium): a request's overlap on one replica is
then a walk of plain dict lookups, and `AllBlocksCleared` or a restart drops one map (and its counts) in O(1).
Copies are counted because vLLM may cache two blocks under one hash (two requests prefilled the same prefix
before either was cached) and sends one `BlockRemoved` per block: the hash stays until its last copy goes.
The capacity is per replica and evicts the least recently *stored* block: it is a memory bound for when
removals were missed (a gap that replay could not fill), not a model of vLLM's own LRU, so it only ever
under-predicts.
KV-cache groups (hybrid models) share one namespace here: single-group models are the supported case.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import takewhile
from typing import Final

# A hash's value packs one 16-bit copy count per medium: GPU, CPU, then STORAGE or any tier vLLM adds later.
_COUNT_BITS: Final = 16
_COUNT_MAX: Final = (1 << _COUNT_BITS) - 1
MEDIUM_SHIFTS: Final = {"GPU": 0, "CPU": _COUNT_BITS}
_OTHER_SHIFT: Final = 2 * _COUNT_BITS


def medium_shift(medium: str | None) -> int:
    """Where a vLLM medium's copy count sits in a hash's value (None, as vLLM publishes without offloading,
    means GPU)."""
    if medium is None:
        return 0
    return MEDIUM_SHIFTS.get(medium.upper(), _OTHER_SHIFT)


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
        """Record one more copy of each block as cached on `replica` in `medium`."""
        shift = medium_shift(medium)
        one = 1 << shift
        blocks = self._replica(replica)
        for h in hashes:
            prev = blocks.get(h)
            if prev is None:
                blocks[h] = one
            else:
                # A saturated count stays put: its removals then under-count, which can only cost hits.
                if (prev >> shift) & _COUNT_MAX != _COUNT_MAX:
                    blocks[h] = prev + one
                blocks.move_to_end(h)
        excess = len(blocks) - self.capacity_blocks
        for _ in range(max(0, excess)):
            blocks.popitem(last=False)
        if excess > 0:
            self.evictions += excess

    def remove(self, replica: str, hashes: Iterable[int], medium: str | None = None) -> None:
        """One copy of each block left `medium` on `replica`; a hash goes with its last copy (unknown hashes and
        media without copies are ignored)."""
        blocks = self._blocks.get(replica)
        if not blocks:
            return
        shift = medium_shift(medium)
        one = 1 << shift
        for h in hashes:
            prev = blocks.get(h)
            if prev is None or not (prev >> shift) & _COUNT_MAX:
                continue
            left = prev - one
            if left:
                blocks[h] = left
            else:
                del blocks[h]

    def clear(self, replica: str) -> None:
        """Forget everything about `replica`, copy counts included (AllBlocksCleared, restart, unrecoverable gap)."""
        self._blocks.pop(replica, None)

    def overlap(self, replica: str, hashes: Sequence[int], medium: str | None = None) -> int:
        """Number of leading `hashes` cached on `replica` (chained hashes: stop at the first miss).

        `medium=None` counts a block held in any medium (a CPU-offloaded block is loaded, not recomputed).
        """
        blocks = self._blocks.get(replica)
        if not blocks:
            return 0
        if medium is None:  # takewhile walks the chain at C speed
            return len(list(takewhile(blocks.__contains__, hashes)))
        n = 0
        mask = _COUNT_MAX << medium_shift(medium)
        get = blocks.get
        for h in hashes:
            if not get(h, 0) & mask:
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
