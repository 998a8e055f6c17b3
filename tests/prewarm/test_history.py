"""The history book: each tracked key's latest whole request, capped per entry and within a total budget that
forgets the least recently updated first (what a history is: each surface's warm_history, tests/api/surfaces)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from app.config.prewarm import PrewarmConfig
from app.prewarm.history import History, HistoryBook
from app.surfaces import CHAT


@dataclass
class Held:
    history: History | None = None


def req(chars: int, tag: str = "") -> History:
    return History({"messages": [{"role": "user", "content": tag}]}, CHAT, chars)


def test_the_budget_forgets_the_least_recently_updated_history_first() -> None:
    book = HistoryBook(max_chars=100, budget_chars=250)
    a, b, c = Held(), Held(), Held()
    book.keep(("p", "t", 1), a, req(100))
    book.keep(("p", "t", 2), b, req(100))
    book.keep(("p", "t", 1), a, req(100, "a again"))  # a is now the newest
    book.keep(("p", "t", 3), c, req(100))
    assert b.history is None, "b was updated longest ago"
    assert a.history is not None and a.history.body["messages"][0]["content"] == "a again"
    assert c.history is not None and book.chars == 200 and len(book) == 2


def test_an_entry_over_the_cap_is_not_kept_and_the_last_that_fit_stays() -> None:
    book = HistoryBook(max_chars=100, budget_chars=1_000)
    a = Held()
    book.keep(("p", "t", 1), a, req(80, "turn 3"))
    book.keep(("p", "t", 1), a, req(101, "turn 4"))
    assert a.history is not None and a.history.body["messages"][0]["content"] == "turn 3" and book.chars == 80
    b = Held()
    book.keep(("p", "t", 2), b, req(101))
    assert b.history is None and len(book) == 1


def test_a_replaced_or_forgotten_history_gives_its_chars_back() -> None:
    book = HistoryBook(max_chars=100, budget_chars=1_000)
    a = Held()
    book.keep(("p", "t", 1), a, req(50))
    book.keep(("p", "t", 1), a, req(70))
    assert book.chars == 70
    book.forget(("p", "t", 1))
    assert a.history is None and book.chars == 0 and len(book) == 0
    book.forget(("p", "t", 9))  # never held: nothing happens


def test_the_config_validates_the_history_bounds() -> None:
    assert PrewarmConfig().histories
    assert not PrewarmConfig(history_max_chars=0).histories and not PrewarmConfig(history_budget_chars=0).histories
    with pytest.raises(ValidationError, match="must not exceed"):
        PrewarmConfig(history_max_chars=2_000, history_budget_chars=1_000)
    with pytest.raises(ValidationError):
        PrewarmConfig(history_budget_chars=-1)
