"""Block hashing and the block pool follow vLLM V1's prefix-caching rules."""

from __future__ import annotations

from app.sim.kv_cache import BLOCK_SIZE, BlockPool, block_hashes, max_hit_blocks


def _tokens(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def test_one_changed_token_invalidates_its_block_and_every_later_one() -> None:
    base = _tokens(5 * BLOCK_SIZE)
    changed = list(base)
    changed[2 * BLOCK_SIZE + 3] += 1  # inside block 2
    a, b = block_hashes(base), block_hashes(changed)
    assert a[:2] == b[:2]
    assert all(x != y for x, y in zip(a[2:], b[2:], strict=True))


def test_salt_changes_block_zero_and_through_the_chain_every_block() -> None:
    toks = _tokens(3 * BLOCK_SIZE)
    plain, salted, other = block_hashes(toks), block_hashes(toks, "tenant-a"), block_hashes(toks, "tenant-b")
    assert all(p != s for p, s in zip(plain, salted, strict=True))
    assert all(s != o for s, o in zip(salted, other, strict=True))
    assert block_hashes(toks, "tenant-a") == salted


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(_tokens(BLOCK_SIZE - 1))) == 0
    assert len(block_hashes(_tokens(3 * BLOCK_SIZE + 15))) == 3
    assert block_hashes(_tokens(3 * BLOCK_SIZE + 15)) == block_hashes(_tokens(3 * BLOCK_SIZE))


def test_hit_is_capped_at_n_minus_one_tokens() -> None:
    assert max_hit_blocks(2 * BLOCK_SIZE) == 1  # exactly two full blocks: the last must be recomputed
    assert max_hit_blocks(2 * BLOCK_SIZE + 1) == 2
    assert max_hit_blocks(1) == 0


def test_incremental_hashing_extends_the_same_chain() -> None:
    toks = _tokens(4 * BLOCK_SIZE)
    head = block_hashes(toks[: 2 * BLOCK_SIZE], "s")
    tail = block_hashes(toks, "s", start=2, parent=head[-1])
    assert head + tail == block_hashes(toks, "s")


def _cached_pool(num_blocks: int, chains: list[list[bytes]]) -> tuple[BlockPool, list[list[int]]]:
    """Allocate, commit and free one request per chain, in order."""
    pool = BlockPool(num_blocks)
    ids = []
    for chain in chains:
        blocks = pool.allocate(len(chain))
        assert blocks is not None
        pool.cache_blocks(blocks, chain)
        pool.free_blocks(blocks)
        ids.append(blocks)
    return pool, ids


def test_lookup_stops_at_first_miss() -> None:
    chain = block_hashes(_tokens(4 * BLOCK_SIZE))
    pool, (blocks,) = _cached_pool(8, [chain])
    probe = [*chain[:2], b"x" * 32, chain[3]]
    assert pool.find_longest_hit(probe, 10) == blocks[:2]
    assert pool.find_longest_hit(chain, 3) == blocks[:3]


def test_lru_evicts_earliest_freed_request_first_and_its_tail_before_its_head() -> None:
    a = block_hashes(_tokens(3 * BLOCK_SIZE, 0))
    b = block_hashes(_tokens(3 * BLOCK_SIZE, 1000))
    pool, (a_ids, b_ids) = _cached_pool(6, [a, b])
    got = pool.allocate(2)
    assert got == [a_ids[2], a_ids[1]]  # A freed first; within A, the tail goes first
    assert pool.find_longest_hit(a, 3) == [a_ids[0]]
    assert pool.find_longest_hit(b, 3) == b_ids


def test_touching_a_cached_block_protects_it_from_eviction() -> None:
    a = block_hashes(_tokens(2 * BLOCK_SIZE, 0))
    pool, (a_ids,) = _cached_pool(4, [a])
    hit = pool.find_longest_hit(a, 2)
    pool.touch(hit)
    fresh = pool.allocate(2)
    assert fresh is not None and not set(fresh) & set(a_ids)
    assert pool.allocate(1) is None  # the only blocks left are in use
    assert pool.find_longest_hit(a, 2) == a_ids


def test_usage_counts_cached_free_blocks_as_free() -> None:
    a = block_hashes(_tokens(2 * BLOCK_SIZE))
    pool, _ = _cached_pool(4, [a])
    assert pool.usage() == 0.0
    pool.allocate(1)
    assert pool.usage() == 0.25


def test_reset_drops_hashes_but_is_refused_while_blocks_are_in_use() -> None:
    a = block_hashes(_tokens(2 * BLOCK_SIZE))
    pool, _ = _cached_pool(4, [a])
    held = pool.allocate(1)
    assert held is not None and pool.reset() is False
    pool.free_blocks(held)
    assert pool.reset() is True
    assert pool.find_longest_hit(a, 2) == []


def test_disabled_caching_never_hits() -> None:
    pool = BlockPool(4, enable_caching=False)
    chain = block_hashes(_tokens(2 * BLOCK_SIZE))
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.cache_blocks(blocks, chain)
    pool.free_blocks(blocks)
    assert pool.find_longest_hit(chain, 2) == []


def test_hashes_are_vllms_so_a_gateway_predicts_them() -> None:
    from app.kvcache.hashing import block_hashes as vllm_block_hashes
    from app.sim.kv_cache import event_hash

    toks = _tokens(5 * BLOCK_SIZE + 3)
    for salt in (None, "tenant-a"):
        for algo in ("sha256_cbor", "sha256"):
            ours = [event_hash(d) for d in block_hashes(toks, salt, algo=algo)]
            assert ours == vllm_block_hashes(toks, BLOCK_SIZE, cache_salt=salt, algo=algo)


def test_events_follow_vllms_block_pool() -> None:
    from app.kvcache.publisher import BlockRemovedEvent, BlockStoredEvent
    from app.sim.kv_cache import event_hash

    toks = _tokens(3 * BLOCK_SIZE)
    chain = block_hashes(toks, "s")
    pool = BlockPool(4, record_events=True)
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.cache_blocks(blocks[:1], chain[:1], first=0, tokens=toks, salt="s")
    pool.cache_blocks(blocks[1:], chain[1:], first=1, parent=chain[0], tokens=toks, salt="s")
    first, rest = pool.take_events()
    assert isinstance(first, BlockStoredEvent) and isinstance(rest, BlockStoredEvent)
    assert first.extra_keys == [("s",)] and first.parent_block_hash is None and first.token_ids == toks[:BLOCK_SIZE]
    assert rest.parent_block_hash == event_hash(chain[0]) and rest.extra_keys == [None, None]
    assert rest.block_hashes == [event_hash(h) for h in chain[1:]] and rest.token_ids == toks[BLOCK_SIZE:]
    assert pool.take_events() == []
    pool.free_blocks(blocks)
    pool.allocate(4)  # evicts all three cached blocks, one BlockRemoved each
    removed = pool.take_events()
    assert all(isinstance(e, BlockRemovedEvent) and e.medium == "GPU" for e in removed)
    assert sorted(h for e in removed for h in e.block_hashes) == sorted(event_hash(h) for h in chain)


def test_a_hash_held_by_two_blocks_survives_one_eviction_and_each_is_announced() -> None:
    from app.kvcache.publisher import BlockRemovedEvent

    (h,) = block_hashes(_tokens(BLOCK_SIZE))
    pool = BlockPool(3, record_events=True)
    a, b = pool.allocate(1), pool.allocate(1)
    assert a is not None and b is not None
    pool.cache_blocks(a, [h])
    pool.cache_blocks(b, [h])  # computed twice before either was cached, as vLLM allows
    pool.free_blocks(a)
    pool.free_blocks(b)
    pool.take_events()
    pool.allocate(2)  # the never-used block, then a
    assert pool.find_longest_hit([h], 1) == b
    pool.allocate(1)
    assert pool.find_longest_hit([h], 1) == []
    assert [type(e) for e in pool.take_events()] == [BlockRemovedEvent, BlockRemovedEvent]


def test_reset_announces_all_blocks_cleared() -> None:
    from app.kvcache.publisher import AllBlocksClearedEvent

    pool = BlockPool(2, record_events=True)
    assert pool.reset()
    assert pool.take_events() == [AllBlocksClearedEvent()]
    assert BlockPool(2).events is None  # off unless the engine publishes
