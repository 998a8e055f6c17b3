"""A paged KV cache with vLLM V1's automatic prefix caching: chained block hashes, LRU free queue, KV events.

Block hashes are vLLM 0.32's own (app.kvcache.hashing: sha256_cbor or sha256 of (parent, tokens, extra keys),
chained from NONE_HASH, cache_salt in block 0's extra keys), so the blocks this pool reports as cached are the
ones a subscriber to its events predicts from the same token ids. With events on, the pool records what vLLM's
BlockPool records: one BlockStored per request and step for the blocks it caches, one BlockRemoved per evicted
block, AllBlocksCleared on a reset; the engine publishes them once per step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from app.kvcache.hashing import HashAlgo, block_digests, chain_digest, none_hash, to_event_hash
from app.kvcache.publisher import (
    KV_SPEC_FULL_ATTENTION,
    AllBlocksClearedEvent,
    BlockRemovedEvent,
    BlockStoredEvent,
)

BLOCK_SIZE = 16  # vLLM's default on GPUs; its CPU backend uses 128 (see profiles)
DEFAULT_HASH_ALGO: HashAlgo = "sha256_cbor"
HASH_ALGOS: tuple[HashAlgo, ...] = ("sha256_cbor", "sha256")
MEDIUM_GPU = "GPU"


def block_hashes(
    tokens: Sequence[int],
    salt: str | None = None,
    *,
    block_size: int = BLOCK_SIZE,
    start: int = 0,
    parent: bytes | None = None,
    algo: HashAlgo = DEFAULT_HASH_ALGO,
) -> list[bytes]:
    """vLLM's chained digests of the full blocks of `tokens` from block index `start` on (partial tail unhashed).

    The salt enters block 0 only (vLLM's `cache_salt` extra key); later blocks inherit it through the chain.
    `parent` is the digest of block `start - 1` when `start > 0`.
    """
    n_full = len(tokens) // block_size
    if start == 0:
        return block_digests(tokens[: n_full * block_size], block_size, salt, algo)
    out: list[bytes] = []
    prev = parent if parent is not None else none_hash(algo)
    for i in range(start, n_full):
        prev = chain_digest(prev, tokens[i * block_size : (i + 1) * block_size], algo)
        out.append(prev)
    return out


# The int vLLM's KV events carry for a digest (low 64 bits, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
event_hash = to_event_hash


def max_hit_blocks(num_tokens: int, block_size: int = BLOCK_SIZE) -> int:
    """At most ⌊(n-1)/block⌋ blocks can hit: the last token is always recomputed to get logits."""
    return max(num_tokens - 1, 0) // block_size


class BlockPool:
    """Fixed pool of KV blocks; freed blocks keep their hash and stay findable until evicted (LRU)."""

    def __init__(
        self,
        num_blocks: int,
        *,
        block_size: int = BLOCK_SIZE,
        enable_caching: bool = True,
        hash_algo: HashAlgo = DEFAULT_HASH_ALGO,
        record_events: bool = False,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        if hash_algo not in HASH_ALGOS:
            raise ValueError(f"prefix caching hash algorithm must be one of {', '.join(HASH_ALGOS)}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.hash_algo: HashAlgo = hash_algo
        self.ref = [0] * num_blocks
        self.hash: list[bytes | None] = [None] * num_blocks
        # Head is evicted first. Values unused; OrderedDict gives O(1) removal from the middle.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        # hash -> the block a lookup finds; like vLLM's map, a hash can have more holders (two requests that
        # computed the same block before either was cached): `dups` keeps them, so evicting one keeps the hit.
        self.cached: dict[bytes, int] = {}
        self.dups: dict[bytes, list[int]] = {}
        self.evictions = 0
        self.events: list[Any] | None = [] if record_events and enable_caching else None

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
        free, ref, hashes = self.free, self.ref, self.hash
        for _ in range(n):
            b, _v = free.popitem(last=False)
            h = hashes[b]
            if h is not None:
                self._evict(b, h)
                hashes[b] = None
                self.evictions += 1
            ref[b] = 1
            out.append(b)
        return out

    def _evict(self, block_id: int, h: bytes) -> None:
        cached, dups = self.cached, self.dups
        others = dups.get(h)
        if cached.get(h) == block_id:
            if others:
                cached[h] = others.pop(0)
                if not others:
                    del dups[h]
            else:
                del cached[h]
        elif others is not None and block_id in others:
            others.remove(block_id)
            if not others:
                del dups[h]
        if self.events is not None:
            # vLLM removes (hash, block) pairs and says so for each, even when another block still holds the hash.
            self.events.append(BlockRemovedEvent([event_hash(h)], MEDIUM_GPU, group_idx=0))

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

    def cache_blocks(
        self,
        block_ids: Sequence[int],
        block_hashes: Sequence[bytes],
        *,
        first: int = 0,
        parent: bytes | None = None,
        tokens: Sequence[int] = (),
        salt: str | None = None,
    ) -> None:
        """Cache full, computed blocks (request block indices first, first+1, ...) under their hashes.

        Like vLLM's cache_full_blocks: the first holder of a hash stays the one found, and one BlockStored
        covers the run, with `parent` (the digest of block first-1) and the run's tokens out of `tokens`.
        """
        if not self.enable_caching or not block_ids:
            return
        hashes, cached, dups = self.hash, self.cached, self.dups
        for b, h in zip(block_ids, block_hashes, strict=True):
            if hashes[b] is not None:
                continue
            hashes[b] = h
            holder = cached.setdefault(h, b)
            if holder != b:
                dups.setdefault(h, []).append(b)
        if self.events is not None:
            bs = self.block_size
            n = len(block_ids)
            extra: list[tuple[Any, ...] | None] = [None] * n
            if first == 0 and salt:
                extra[0] = (salt,)  # vLLM publishes extra keys untagged: the bare cache_salt
            self.events.append(
                BlockStoredEvent(
                    block_hashes=[event_hash(h) for h in block_hashes],
                    parent_block_hash=event_hash(parent) if parent is not None and first > 0 else None,
                    token_ids=list(tokens[first * bs : (first + n) * bs]),
                    block_size=bs,
                    lora_id=None,
                    medium=MEDIUM_GPU,
                    lora_name=None,
                    extra_keys=extra,
                    group_idx=0,
                    kv_cache_spec_kind=KV_SPEC_FULL_ATTENTION,
                )
            )

    def take_events(self) -> list[Any]:
        """The events recorded since the last call (vLLM's take_events), oldest first."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events

    def reset(self) -> bool:
        """Drop every cached hash; refused (False) while any block is in use, as vLLM refuses."""
        if len(self.free) != self.num_blocks:
            return False
        self.cached.clear()
        self.dups.clear()
        self.hash = [None] * self.num_blocks
        if self.events is not None:
            self.events.append(AllBlocksClearedEvent())
        return True
