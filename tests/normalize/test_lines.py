"""Line parsing: labels, bullets and emphasis, and the first-sight presumption."""

from __future__ import annotations

import pytest

from app.normalize.lines import parse_line, presume
from app.normalize.rules import RULES
from tests.normalize.helpers import NOW

ALL = frozenset(RULES)


def parsed(line: str) -> tuple[str | None, tuple[str, ...], tuple[str, ...]] | None:
    got = parse_line(line, 0, len(line), ALL, NOW)
    return None if got is None else (got.label, got.rules, got.values)


@pytest.mark.parametrize(
    ("line", "label"),
    [
        ("Current time: 2026-11-30T01:00:00Z", "Current time"),
        ("- **Current time:** 2026-11-30T01:00:00Z", "Current time"),
        ("  * request_id = req_8f3kd93jd0", "request_id"),
        ("2026-11-30T01:00:00Z", None),
    ],
)
def test_label_and_value_are_split(line: str, label: str | None) -> None:
    got = parsed(line)
    assert got is not None and got[0] == label


def test_skeleton_blanks_the_spans_only() -> None:
    a = parse_line("Now: 2026-11-30T01:00:00Z (UTC)", 0, 31, ALL, NOW)
    b = parse_line("Now: 2027-01-02T03:04:05Z (UTC)", 0, 31, ALL, NOW)
    assert a is not None and b is not None
    assert a.skeleton == b.skeleton and a.values != b.values


@pytest.mark.parametrize(
    ("label", "rules", "expected"),
    [
        ("Request ID", ("uuid",), True),
        ("Current time", ("iso_datetime",), True),
        ("Today's date", ("date",), True),
        ("Date", ("date",), False),  # few-shot style label: learn first
        ("User ID", ("prefixed_id",), False),  # stable per user: learn first
        (None, ("iso_datetime",), False),  # unlabelled: learn first
    ],
)
def test_first_sight_presumption(label: str | None, rules: tuple[str, ...], expected: bool) -> None:
    assert presume(label, rules) is expected


def test_an_xml_field_line_reads_as_label_and_value() -> None:
    from datetime import UTC, datetime

    from app.normalize.lines import parse_line
    from app.normalize.rules import RULES

    text = "  <current_date>2026-12-01T10:11:12Z</current_date>"
    line = parse_line(text, 0, len(text), frozenset(RULES), datetime(2026, 12, 1, tzinfo=UTC))
    assert line is not None and line.label == "current date" and line.values == ("2026-12-01T10:11:12Z",)
    assert parse_line("<cwd>/repo</cwd>", 0, 16, frozenset(RULES), datetime(2026, 12, 1, tzinfo=UTC)) is None
    assert parse_line("<a>x</b>", 0, 8, frozenset(RULES), datetime(2026, 12, 1, tzinfo=UTC)) is None
