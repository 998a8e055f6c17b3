"""Each detector on its own: positives, and the near-misses it must leave alone."""

from __future__ import annotations

import pytest

from app.normalize.rules import RULES, TYPED_RULES
from app.normalize.scan import find_candidates
from tests.normalize.helpers import NOW

ALL = TYPED_RULES  # the detectors; lines found by structure alone (`learned`) are pinned in test_learning.py
EPOCH_NOW = int(NOW.timestamp())


def rules_of(text: str, allowed: frozenset[str] = ALL) -> list[tuple[str, ...]]:
    return [c.rules for c in find_candidates(text, ("s",), allowed, NOW)]


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("Current time: 2026-11-30T01:02:03Z", "iso_datetime"),
        ("Timestamp: 2026-11-30 01:02:03.123+01:00", "iso_datetime"),
        ("2026-11-30T01:02:03+00:00", "iso_datetime"),
        ("Now: 20261130T010203Z", "iso_datetime"),
        ("Date: Mon, 30 Nov 2026 01:02:03 GMT", "rfc2822_datetime"),
        ("Sent: 30 Nov 2026 01:02 +0000", "rfc2822_datetime"),
        ("Today's date: 2026-11-30", "date"),
        ("Today: November 30, 2026", "date"),
        ("- **Date:** 30 Nov 2026", "date"),
        ("Today: 11/30/2026", "date"),
        ("Current date/time: 10:32 PM, Monday", "labelled_datetime"),
        ("Local time = 01h02", "labelled_datetime"),
        ("Request ID: 7f3e2a10-1b2c-4d5e-8f90-123456789abc", "uuid"),
        ("trace: 4bf92f3577b34da6a3ce929d0e0e4736", "hex_id"),
        ("Request: req_8f3kd93jd0", "prefixed_id"),
        ("trace-9a8b7c6d5e", "prefixed_id"),
        ("Session: abc123XYZ789", "prefixed_id"),
        ("Context: session 4f9c2e81aa", "prefixed_id"),
        (f"Unix time: {EPOCH_NOW}", "epoch"),
        (f"Now (ms): {EPOCH_NOW}123", "epoch"),
    ],
)
def test_detector_finds_span_on_metadata_line(line: str, rule: str) -> None:
    assert rules_of(f"{line}\nYou are a helpful assistant.") == [(rule,)]


@pytest.mark.parametrize(
    "text",
    [
        "Refunds are allowed within 30 days of the 2024-01-05 policy change, said the memo.",  # prose
        "Commit: 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39",  # git SHA: content, not metadata
        "Fixed in 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39 by the team last week.",
        "Version: 2.4.1",
        "Founded: 1234567890",  # an epoch-shaped number far from now
        "Order total: 1796000000123456",
        "Request: request-response",  # a word after the prefix, no digits
        "deadbeefdeadbeefdeadbeef",  # hex without digits
        '"date": "2026-11-30T01:02:03Z",',  # JSON member
        "Time: `2026-11-30T01:02:03Z`",  # inline code
        "Call me at 10:30 tomorrow about the refund for order 55",
    ],
)
def test_detector_leaves_near_misses(text: str) -> None:
    assert rules_of(f"{text}\nYou are a helpful assistant.") == []


def test_line_with_two_spans_reports_both_rules() -> None:
    assert rules_of(f"Now: 2026-11-30T01:02:03Z ({EPOCH_NOW})\nok") == [("iso_datetime", "epoch")]


def test_disallowed_rule_keeps_its_line_in_place() -> None:
    text = "Current time: 2026-11-30T01:02:03Z\nok"
    assert rules_of(text, ALL - {"iso_datetime"}) == []
    assert rules_of(text, frozenset({"iso_datetime"})) == [("iso_datetime",)]


@pytest.mark.parametrize(
    "text",
    [
        "```\nCurrent time: 2026-11-30T01:02:03Z\n```\n",
        "~~~yaml\nrequest id: req_8f3kd93jd0\n~~~\n",
        "{\n  \"now\": 1,\n  Current time: 2026-11-30T01:02:03Z\n}\n",
        "> Current time: 2026-11-30T01:02:03Z\n",
        "<document>\nCurrent time: 2026-11-30T01:02:03Z\n</document>\n",
        "<example>\nRequest ID: req_8f3kd93jd0\n</example>\n",
    ],
)
def test_detector_skips_code_json_and_quoted_documents(text: str) -> None:
    assert rules_of(text + "You are a helpful assistant.") == []


def test_line_after_a_closed_fence_is_still_found() -> None:
    text = "```\ncode 1\n```\nCurrent time: 2026-11-30T01:02:03Z\nok"
    assert rules_of(text) == [("iso_datetime",)]


def test_only_the_head_is_scanned() -> None:
    filler = "You are a helpful assistant who answers briefly.\n" * 60
    assert rules_of(filler + "Current time: 2026-11-30T01:02:03Z\n") == []


def test_rule_names_are_stable_snake_case() -> None:
    assert RULES == (
        "iso_datetime", "rfc2822_datetime", "date", "labelled_datetime", "uuid", "hex_id", "prefixed_id", "epoch",
        "learned", "section", "reminder",
    )
