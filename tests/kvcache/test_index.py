"""The bounded block index: per-replica, per-medium, leading-overlap semantics."""

from __future__ import annotations

import pytest

from app.kvcache.index import KvIndex


def test_overlap_counts_leading_blocks_and_stops_at_first_miss() -> None:
    idx = KvIndex()
    idx.store("a", [1, 2, 3, 5])
    assert idx.overlap("a", [1, 2, 3, 4, 5]) == 3
    assert idx.overlap("a", [9, 1, 2]) == 0
    assert idx.overlap("b", [1, 2]) == 0


def test_replicas_are_independent() -> None:
    idx = KvIndex()
    idx.store("a", [1, 2])
    idx.store("b", [1])
    assert (idx.overlap("a", [1, 2]), idx.overlap("b", [1, 2])) == (2, 1)


def test_remove_drops_block_only_from_its_medium() -> None:
    idx = KvIndex()
    idx.store("a", [1, 2], medium="GPU")
    idx.store("a", [2], medium="CPU")
    idx.remove("a", [2], medium="GPU")
    assert idx.overlap("a", [1, 2]) == 2  # still on CPU
    assert idx.overlap("a", [1, 2], medium="GPU") == 1
    idx.remove("a", [2], medium="CPU")
    assert idx.overlap("a", [1, 2]) == 1
    assert idx.size("a") == 1


def test_null_medium_means_gpu() -> None:
    idx = KvIndex()
    idx.store("a", [1], medium=None)
    assert idx.overlap("a", [1], medium="GPU") == 1
    idx.remove("a", [1], medium="GPU")
    assert idx.size() == 0


def test_clear_forgets_one_replica_only() -> None:
    idx = KvIndex()
    idx.store("a", [1, 2])
    idx.store("b", [1, 2])
    idx.clear("a")
    assert idx.overlap("a", [1]) == 0
    assert idx.overlap("b", [1, 2]) == 2
    assert idx.replicas() == ["b"]


def test_capacity_evicts_least_recently_stored() -> None:
    idx = KvIndex(capacity_blocks=3)
    idx.store("a", [1, 2, 3])
    idx.store("a", [1])  # re-stored: now the newest
    idx.store("a", [4])
    assert idx.size("a") == 3
    assert idx.overlap("a", [1]) == 1
    assert idx.overlap("a", [2]) == 0
    assert idx.evictions == 1


def test_unknown_removals_are_ignored() -> None:
    idx = KvIndex()
    idx.remove("a", [1])
    idx.store("a", [1])
    idx.remove("a", [2, 3])
    assert idx.size() == 1


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        KvIndex(capacity_blocks=0)


def test_a_hash_stored_twice_stays_until_both_copies_are_removed() -> None:
    idx = KvIndex()
    idx.store("a", [1, 2])
    idx.store("a", [2])  # a second block cached under hash 2 (two requests prefilled it at once)
    idx.remove("a", [2])
    assert idx.overlap("a", [1, 2]) == 2
    idx.remove("a", [2])
    assert idx.overlap("a", [1, 2]) == 1
    idx.remove("a", [2])  # more removals than copies: ignored, never negative
    idx.store("a", [2])
    assert idx.overlap("a", [1, 2]) == 2


def test_copies_are_counted_per_medium() -> None:
    idx = KvIndex()
    idx.store("a", [1], medium="GPU")
    idx.store("a", [1], medium="GPU")
    idx.store("a", [1], medium="CPU")
    idx.remove("a", [1], medium="CPU")
    idx.remove("a", [1], medium="CPU")  # no CPU copy left: does not touch the GPU copies
    assert idx.overlap("a", [1], medium="CPU") == 0
    idx.remove("a", [1], medium="GPU")
    assert idx.overlap("a", [1], medium="GPU") == 1
    idx.remove("a", [1], medium="GPU")
    assert idx.size("a") == 0


def test_clear_drops_the_copy_counts() -> None:
    idx = KvIndex()
    idx.store("a", [1])
    idx.store("a", [1])
    idx.clear("a")  # AllBlocksCleared or a restart
    idx.store("a", [1])
    idx.remove("a", [1])
    assert idx.overlap("a", [1]) == 0


def test_a_saturated_count_stays_bounded() -> None:
    idx = KvIndex()
    for _ in range(70_000):
        idx.store("a", [1])
    for _ in range(65_534):
        idx.remove("a", [1])
    assert idx.overlap("a", [1]) == 1  # 65,535 counted copies, 65,534 removed
    idx.remove("a", [1])
    assert idx.size("a") == 0
