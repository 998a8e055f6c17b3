"""Positional references and protected blocks."""

from __future__ import annotations

import pytest

from app.normalize.regions import in_ranges, protected_ranges, refers_by_position


@pytest.mark.parametrize(
    "text",
    [
        "How many days after the date above is Friday?",
        "Use the timestamp shown below.",
        "Quote the above request id in your reply.",
        "The aforementioned ID identifies the session.",
        "Mention the session ID given above.",
    ],
)
def test_positional_references_are_found(text: str) -> None:
    assert refers_by_position(text)


@pytest.mark.parametrize(
    "text",
    [
        "Answer the request below carefully.",
        "Use the tools below when needed.",
        "As in the previous time, keep it short.",
        "The date is in the header.",
        "See the examples above.",
    ],
)
def test_other_position_words_do_not_count(text: str) -> None:
    assert not refers_by_position(text)


def test_fences_json_quotes_and_documents_are_protected() -> None:
    text = "a\n```\nx\n```\nb\n{\n \"k\": [1,\n 2]\n}\nc\n> quoted\nd\n<document id=1>\ndoc\n</document>\ne"
    ranges = protected_ranges(text)
    for inside in ("x", '"k"', " 2]", "quoted", "doc"):
        assert in_ranges(text.index(inside), ranges), inside
    lines = text.split("\n")
    starts = [sum(len(ln) + 1 for ln in lines[:i]) for i in range(len(lines))]
    for outside in ("a", "b", "c", "d", "e"):
        assert not in_ranges(starts[lines.index(outside)], ranges), outside


def test_unclosed_fence_protects_to_the_end() -> None:
    text = "a\n```\nCurrent time: 2026-11-30T01:00:00Z\n"
    assert in_ranges(text.index("Current"), protected_ranges(text))
