"""The terminal table: one column per run, an error-kinds row only when something failed."""

from __future__ import annotations

import io

from rich.console import Console

from app.bench.report import BenchResult, summarize
from app.bench.spec import BenchSpec, RequestRecord
from app.bench.table import print_table


def _result(concurrency: int, failed: int) -> BenchResult:
    spec = BenchSpec(base_url="http://x", model="m", concurrency=concurrency, slo_ttft_ms=100)
    records = [RequestRecord(index=i, session=i, turn=0, tenant=0, route_class="interactive", ok=i >= failed,
                             ttft_s=0.01, e2e_s=0.1, output_tokens=5, error="HTTP 503: busy" if i < failed else None)
               for i in range(4)]
    return BenchResult(spec=spec, records=records, summary=summarize(records, 1.0, spec))


def _render(results: list[BenchResult]) -> str:
    out = io.StringIO()
    print_table(results, Console(file=out, width=200))
    return out.getvalue()


def test_sweep_columns_side_by_side_with_slo_in_title() -> None:
    text = _render([_result(1, 0), _result(8, 0)])
    assert "chat c=1" in text and "chat c=8" in text and "SLO TTFT≤100ms" in text
    assert "error kinds" not in text


def test_error_kinds_row_appears_when_requests_failed() -> None:
    text = _render([_result(1, 2)])
    assert "error kinds" in text and "HTTP 503 x2" in text
