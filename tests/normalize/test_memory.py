"""VolatilityMemory: learns change, stays bounded, keeps tenants apart."""

from __future__ import annotations

import pytest

from app.normalize import VolatilityMemory


def test_span_becomes_volatile_once_it_changes_and_stays_so() -> None:
    m = VolatilityMemory()
    assert m.observe("t", 1, 100, False) is False
    assert m.observe("t", 1, 100, False) is False
    assert m.observe("t", 1, 101, False) is True
    assert m.observe("t", 1, 101, False) is True  # sticky


def test_first_sight_follows_the_presumption() -> None:
    m = VolatilityMemory()
    assert m.observe("t", 1, 100, True) is True
    assert m.peek("t", 1) is True and m.peek("t", 2) is None


def test_tenants_do_not_share_what_they_learn() -> None:
    m = VolatilityMemory()
    m.observe("a", 1, 100, False)
    m.observe("a", 1, 101, False)
    assert m.peek("b", 1) is None
    assert m.observe("b", 1, 102, False) is False


def test_entries_per_tenant_are_bounded_lru() -> None:
    m = VolatilityMemory(capacity_per_tenant=4)
    for key in range(10):
        m.observe("t", key, 0, False)
    assert m.size("t") == 4
    assert m.peek("t", 0) is None and m.peek("t", 9) is False


def test_tenant_count_is_bounded_lru() -> None:
    m = VolatilityMemory(max_tenants=3)
    for t in "abcde":
        m.observe(t, 1, 1, False)
    assert m.size() == 3 and m.peek("a", 1) is None and m.peek("e", 1) is False


def test_static_text_cache_resets_when_rules_change() -> None:
    m = VolatilityMemory().for_tenant("t")
    m.add_static_text(5, frozenset({"uuid"}))
    assert m.is_static_text(5, frozenset({"uuid"}))
    assert not m.is_static_text(5, frozenset({"uuid", "date"}))


def test_positional_answers_are_cached_by_hash() -> None:
    m = VolatilityMemory().for_tenant("t")
    assert m.positional(9) is None
    m.add_positional(9, True)
    assert m.positional(9) is True


def test_invalid_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        VolatilityMemory(capacity_per_tenant=0)


def test_memory_holds_hashes_and_rule_names_only() -> None:
    from app.normalize import RULES
    from tests.normalize.helpers import STATIC_SYSTEM, chat_body, header, run

    memory = VolatilityMemory()
    for i in range(3):
        run(chat_body(header(i) + STATIC_SYSTEM * 4, user=header(i + 9) + "hi"), memory=memory)

    def leaves(obj: object) -> list[object]:
        if isinstance(obj, dict):
            return [x for k, v in obj.items() for x in (*leaves(k), *leaves(v))]
        if isinstance(obj, list | tuple | set):
            return [x for v in obj for x in leaves(v)]
        if isinstance(obj, frozenset):
            assert obj <= set(RULES)
            return []
        if hasattr(obj, "__slots__") and not isinstance(obj, int):
            # fingerprint_key: bytes derived from the salt secret and the tenant id, no prompt text
            return [x for name in obj.__slots__ if name != "fingerprint_key" for x in leaves(getattr(obj, name))]
        return [obj]

    found = leaves(list(memory._tenants.values()))  # keyed by tenant id; below that, numbers only
    assert found and all(x is None or isinstance(x, int) for x in found)
