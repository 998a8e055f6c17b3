"""The prefix cache: the longest cached prefix a prompt starts with, per salt, bounded."""

from __future__ import annotations

import pytest

from app.kvcache.prefixes import Prefix, PrefixCache

HEAD = "S" * 8


def prefix(text: str) -> Prefix:
    return Prefix(text, (len(text),), [], [])


def test_the_longest_prefix_the_text_starts_with_wins() -> None:
    cache = PrefixCache(head_chars=8)
    cache.put(None, prefix(HEAD + "a"))
    cache.put(None, prefix(HEAD + "b|c"))
    cache.put(None, prefix(HEAD + "b|cd"))  # extends HEAD+"b|c": drops it
    assert len(cache) == 2
    found = cache.longest(HEAD + "b|cd|e", None)
    assert found is not None and found.text == HEAD + "b|cd"
    assert cache.longest(HEAD + "b|c|e", None) is None
    assert cache.longest(HEAD + "x", None) is None


def test_prefixes_are_kept_per_salt() -> None:
    cache = PrefixCache(head_chars=8)
    cache.put("tenant-a", prefix(HEAD + "a"))
    assert cache.longest(HEAD + "a|b", "tenant-b") is None
    assert cache.longest(HEAD + "a|b", None) is None
    assert cache.longest(HEAD + "a|b", "tenant-a") is not None


def test_texts_shorter_than_the_head_are_not_cached() -> None:
    cache = PrefixCache(head_chars=8)
    cache.put(None, prefix("short"))
    assert len(cache) == 0 and cache.longest("short and more", None) is None


def test_the_cache_is_bounded_per_group_and_overall() -> None:
    cache = PrefixCache(capacity=3, per_group=2, head_chars=8)
    for c in "abc":
        cache.put(None, prefix(HEAD + c))
    assert len(cache) == 2 and cache.longest(HEAD + "a!", None) is None  # the group's oldest went
    cache.put(None, prefix("T" * 8 + "x"))
    cache.put(None, prefix("U" * 8 + "y"))
    assert len(cache) == 3
    assert cache.longest(HEAD + "b!", None) is None  # the least recently used group's oldest went first
    assert cache.longest(HEAD + "c!", None) is not None


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PrefixCache(capacity=0)
