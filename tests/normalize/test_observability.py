"""Span attributes and counter points carry rule names and counts, never values."""

from __future__ import annotations

from app.context import NormalizeReport
from app.normalize import moved_span_points, span_attributes


def test_counter_points_one_per_rule_with_tenant() -> None:
    report = NormalizeReport(mode="on", moved={"uuid": 1, "iso_datetime": 2}, applied=True)
    assert moved_span_points(report, "acme") == [
        (2, {"rule": "iso_datetime", "tenant": "acme", "mode": "on"}),
        (1, {"rule": "uuid", "tenant": "acme", "mode": "on"}),
    ]
    assert moved_span_points(NormalizeReport(mode="off"), "acme") == []


def test_span_attributes_summarize_the_report() -> None:
    report = NormalizeReport(mode="observe", moved={"date": 1}, tools_canonicalized=3)
    attrs = span_attributes(report)
    assert attrs["kvgate.normalize.mode"] == "observe"
    assert attrs["kvgate.normalize.moved_spans"] == 1
    assert attrs["kvgate.normalize.rules"] == "date"
    assert attrs["kvgate.normalize.tools_canonicalized"] == 3
