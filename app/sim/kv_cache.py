"""A paged KV cache with vLLM V1's automatic prefix caching: chained block hashes, LRU free queue."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

BLOCK_SIZE = 16  # vLLM's default on GPUs; its CPU backend uses 128 (see profiles)
# The parent of block 0; vLLM seeds it randomly per process, a constant is as good inside one process.
NONE_HASH = b"\x00" * 32


def hash_block(parent: bytes, tokens: Sequence[int], salt: str | None = None) -> bytes:
    """vLLM's block hash: hash(parent hash, the block's token ids, extra keys); the salt is an extra key."""
    h = hashlib.sha256(parent)
    h.update(array("q", tokens).tobytes())
    if salt is not None:
        h.update(b"\x01salt")
        h.update(salt.encode())
    return h.digest()


def block_hashes(
    tokens: Sequence[int],
    salt: str | None = None,
    *,
    block_size: int = BLOCK_SIZE,
    start: int = 0,
    parent: bytes = NONE_HASH,
) -> list[bytes]:
    """Chained hashes of the full blocks of `tokens` from block index `start` on; a partial tail is not hashed.

    The salt enters block 0 only (as vLLM's `cache_salt` does); later blocks inherit it through the chain.
    """
    out: list[bytes] = []
    n_full = len(tokens) // block_size
    for i in range(start, n_full):
        parent = hash_block(parent, tokens[i * block_size : (i + 1) * block_size], salt if i == 0 else None)
        out.append(parent)
    return out


def max_hit_blocks(num_tokens: int, block_size: int = BLOCK_SIZE) -> int:
    """At most ⌊(n-1)/block⌋ blocks can hit: the last token is always recomputed to get logits."""
    return max(num_tokens - 1, 0) // block_size


class BlockPool:
    """Fixed pool of KV blocks; freed blocks keep their hash and stay findable until evicted (LRU)."""

    def __init__(self, num_blocks: int, *, block_size: int = BLOCK_SIZE, enable_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref = [0] * num_blocks
        self.hash: list[bytes | None] = [None] * num_blocks
        # Head is evicted first. Values unused; OrderedDict gives O(1) removal from the middle.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, int] = {}
        self.evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks not referenced by any request (cached ones included: they can be evicted)."""
        return len(self.free)

    def usage(self) -> float:
        """KV-cache usage as vLLM reports it: 1 - free/total."""
        return 1.0 - len(self.free) / self.num_blocks

    def find_longest_hit(self, hashes: Sequence[bytes], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of `hashes`, stopping at the first miss, at most max_blocks."""
        if not self.enable_caching:
            return []
        hit: list[int] = []
        cached = self.cached
        for h in hashes[:max_blocks]:
            bid = cached.get(h)
            if bid is None:
                break
            hit.append(bid)
        return hit

    def evictable_among(self, block_ids: Sequence[int]) -> int:
        """How many of `block_ids` sit in the free queue (touching them consumes free blocks)."""
        ref = self.ref
        return sum(1 for b in block_ids if ref[b] == 0)

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on hit blocks, pulling free ones out of the eviction queue."""
        ref, free = self.ref, self.free
        for b in block_ids:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """n fresh blocks from the head of the free queue (evicting their cached hashes), or None if short."""
        if n > len(self.free):
            return None
        out: list[int] = []
        free, ref, hashes, cached = self.free, self.ref, self.hash, self.cached
        for _ in range(n):
            b, _v = free.popitem(last=False)
            h = hashes[b]
            if h is not None:
                if cached.get(h) == b:
                    del cached[h]
                hashes[b] = None
                self.evictions += 1
            ref[b] = 1
            out.append(b)
        return out

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """Release a request's blocks: tail first into the LRU queue, so chain tails are evicted before heads.

        Blocks without a hash can never hit; they go to the head to be reused first, as in vLLM.
        """
        ref, free, hashes = self.ref, self.free, self.hash
        for b in reversed(block_ids):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
                if hashes[b] is None or not self.enable_caching:
                    free.move_to_end(b, last=False)

    def commit(self, block_id: int, block_hash: bytes) -> None:
        """Mark a full, computed block as cached under its hash (first holder of a hash stays the one found)."""
        if not self.enable_caching or self.hash[block_id] is not None:
            return
        self.hash[block_id] = block_hash
        self.cached.setdefault(block_hash, block_id)

    def reset(self) -> bool:
        """Drop every cached hash; refused (False) while any block is in use, as vLLM refuses."""
        if len(self.free) != self.num_blocks:
            return False
        self.cached.clear()
        self.hash = [None] * self.num_blocks
        return True
