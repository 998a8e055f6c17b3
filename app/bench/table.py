"""The terminal table: one column per run (a sweep's levels side by side), one row per metric."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

from app.bench.report import BenchResult, Distribution, Summary


def _f(value: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _dist(d: Distribution) -> str:
    return f"{_f(d.p50)} / {_f(d.p90)} / {_f(d.p99)}"


def _usd(value: float | None) -> str:
    return _f(value, "${:,.4f}") if value is not None and value < 1 else _f(value, "${:,.2f}")


ROWS: list[tuple[str, Callable[[Summary], str]]] = [
    ("requests ok / errors", lambda s: f"{s.ok} / {s.errors}"),
    ("measured span s", lambda s: _f(s.wall_s, "{:,.2f}")),
    ("throughput req/s", lambda s: _f(s.requests_per_s, "{:,.2f}")),
    ("output tokens/s", lambda s: _f(s.output_tokens_per_s)),
    ("total tokens/s (in+out)", lambda s: _f(s.total_tokens_per_s)),
    ("TTFT ms p50/p90/p99", lambda s: _dist(s.ttft_ms)),
    ("TPOT ms p50/p90/p99", lambda s: _dist(s.tpot_ms)),
    ("ITL ms p50/p90/p99", lambda s: _dist(s.itl_ms)),
    ("E2E ms p50/p90/p99", lambda s: _dist(s.e2e_ms)),
    ("tokens prompt/cached/output", lambda s: f"{s.prompt_tokens:,} / {s.cached_tokens:,} / {s.output_tokens:,}"),
    ("cached-token ratio", lambda s: _f(None if s.cached_ratio is None else s.cached_ratio * 100, "{:.1f}%")),
    ("goodput req/s (share)", lambda s: "-" if s.goodput_requests_per_s is None else
     f"{s.goodput_requests_per_s:,.2f} ({(s.goodput_ratio or 0) * 100:.0f}%)"),
    ("$/M output tokens", lambda s: _usd(s.cost.usd_per_m_output)),
    ("$/M tokens (in+out)", lambda s: _usd(s.cost.usd_per_m_total)),
    ("run cost / reference", lambda s: f"{_usd(s.cost.run_cost_usd)} / {_usd(s.cost.reference_cost_usd)}"),
    ("billed by the gateway", lambda s: _f(s.gateway_cost_usd, "${:,.6f}")),
    ("savings vs reference", lambda s: "-" if s.cost.savings_ratio is None else
     f"{_usd(s.cost.savings_usd)} ({s.cost.savings_ratio * 100:.0f}%)"),
]


def _column_title(r: BenchResult) -> str:
    load = f"c={r.spec.concurrency}" if r.spec.rate is None else f"rate={r.spec.rate:g}/s"
    return f"{r.spec.workload} {load}"


def render_table(results: Sequence[BenchResult]) -> Table:
    """A rich Table of the runs' summaries."""
    first = results[0].spec
    slo = []
    if first.slo_ttft_ms is not None:
        slo.append(f"TTFT≤{first.slo_ttft_ms:g}ms")
    if first.slo_tpot_ms is not None:
        slo.append(f"TPOT≤{first.slo_tpot_ms:g}ms")
    targets = ", ".join((first.base_url, *first.more_base_urls))
    title = f"kvgate bench — {first.model} at {targets}" + (f" — SLO {', '.join(slo)}" if slo else "")
    table = Table(title=title)
    table.add_column("metric")
    for r in results:
        table.add_column(_column_title(r), justify="right")
    for name, cell in ROWS:
        table.add_row(name, *(cell(r.summary) for r in results))
    kinds = {k for r in results for k in r.summary.error_kinds}
    if kinds:
        table.add_row("error kinds", *(", ".join(f"{k} x{n}" for k, n in r.summary.error_kinds.items()) or "-"
                                       for r in results))
    return table


def print_table(results: Sequence[BenchResult], console: Console | None = None) -> None:
    """Print the table to the terminal (stdout unless another console is given)."""
    # Piped output gets a wide fixed width: rich's 80-column default would wrap a sweep's columns.
    (console or Console(width=None if sys.stdout.isatty() else 200)).print(render_table(results))
