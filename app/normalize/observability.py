"""What normalization exposes: span attributes and counter points, built from the report (never values)."""

from __future__ import annotations

from app.context import NormalizeReport

MOVED_SPANS_METRIC = "gateway.normalize.moved_spans"


def span_attributes(report: NormalizeReport) -> dict[str, str | int | bool]:
    """Attributes for the request span: mode, counts and rule names only."""
    return {
        "kvgate.normalize.mode": report.mode,
        "kvgate.normalize.applied": report.applied,
        "kvgate.normalize.moved_spans": report.moved_total,
        "kvgate.normalize.rules": ",".join(sorted(report.moved)),
        "kvgate.normalize.tools_canonicalized": report.tools_canonicalized,
        "kvgate.normalize.date_pinned": report.date_pinned,
    }


def moved_span_points(report: NormalizeReport, tenant_id: str) -> list[tuple[int, dict[str, str]]]:
    """(count, attributes) to add to `gateway.normalize.moved_spans`, one per rule that fired.

    Observe mode counts too (what would have moved), told apart by the `mode` attribute.
    """
    if report.mode == "off":
        return []
    return [
        (count, {"rule": rule, "tenant": tenant_id, "mode": report.mode})
        for rule, count in sorted(report.moved.items())
        if count
    ]
