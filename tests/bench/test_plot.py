"""The PNG plots: a sweep against concurrency, and latency CDFs for a single run."""

from __future__ import annotations

from pathlib import Path

from app.bench.plot import plot_result
from app.bench.report import BenchResult, summarize
from app.bench.spec import BenchSpec, RequestRecord

PNG = b"\x89PNG\r\n\x1a\n"


def _result(concurrency: int) -> BenchResult:
    spec = BenchSpec(base_url="http://x", model="m", concurrency=concurrency)
    records = [RequestRecord(index=i, session=i, turn=0, tenant=0, route_class="interactive", ok=True,
                             ttft_s=0.01 * (i + 1), tpot_s=0.002 * concurrency, e2e_s=0.1 * (i + 1),
                             output_tokens=10, usage_reported=True) for i in range(5)]
    return BenchResult(spec=spec, records=records, summary=summarize(records, 1.0, spec))


def test_single_run_plot_is_a_png(tmp_path: Path) -> None:
    out = plot_result([_result(4)], tmp_path / "one.png")
    assert out.read_bytes()[:8] == PNG


def test_sweep_plot_is_a_png(tmp_path: Path) -> None:
    out = plot_result([_result(c) for c in (1, 8, 32)], tmp_path / "sweep.png")
    assert out.read_bytes()[:8] == PNG
