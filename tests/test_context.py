"""The request context's records: the x-kvgate-normalized header value a report gives."""

from __future__ import annotations

import pytest

from app.context import NormalizeReport


@pytest.mark.parametrize("mode", ["on", "observe"])
def test_a_report_that_moved_nothing_says_moved_0(mode: str) -> None:
    assert NormalizeReport(mode=mode).header() == f"{mode};moved=0"  # type: ignore[arg-type]


def test_a_report_lists_its_rules_sorted_with_head_tools_and_date() -> None:
    report = NormalizeReport(mode="on", moved={"uuid": 1, "date": 2}, to_head=1, tools_canonicalized=3,
                             date_pinned=True)
    assert report.header() == "on;moved=3;rules=date:2,uuid:1;head=1;tools=3;date_pinned"


def test_a_report_with_only_tools_or_a_date_takes_the_full_form() -> None:
    assert NormalizeReport(mode="on", tools_canonicalized=2).header() == "on;moved=0;tools=2"
    assert NormalizeReport(mode="on", date_pinned=True).header() == "on;moved=0;date_pinned"
    assert NormalizeReport(mode="off").header() == "off"
