"""PNG plots: latency percentiles and throughput against concurrency (a sweep), or latency CDFs (one run)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.bench.report import BenchResult


def _pyplot():  # type: ignore[no-untyped-def]
    # Imported lazily: matplotlib is heavy and only needed with --plot; Agg needs no display.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(results: Sequence[BenchResult], out: str | Path) -> Path:
    """TTFT and TPOT p50/p99 and output tokens/s against concurrency; one point per run."""
    plt = _pyplot()
    xs = [r.spec.concurrency for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, attr, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for pct, style in (("p50", "o-"), ("p99", "s--")):
            ys = [getattr(getattr(r.summary, attr), pct) for r in results]
            ax.plot(xs, [float("nan") if y is None else y for y in ys], style, label=f"{name} {pct}")
        ax.set_ylabel(f"{name} (ms)")
    axes[2].plot(xs, [r.summary.output_tokens_per_s for r in results], "o-", label="output tokens/s")
    axes[2].set_ylabel("output tokens/s")
    rps = axes[2].twinx()  # requests/s is orders of magnitude below tokens/s: its own axis
    rps.plot(xs, [r.summary.requests_per_s for r in results], "^:", color="tab:orange", label="requests/s")
    rps.set_ylabel("requests/s")
    rps.legend(loc="lower right")
    for ax in axes:
        ax.set_xlabel("concurrency")
        if len(set(xs)) > 1 and min(xs) > 0:
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    spec = results[0].spec
    fig.suptitle(f"kvgate bench: {spec.workload} on {spec.model}")
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_result(results: Sequence[BenchResult], out: str | Path) -> Path:
    """The sweep plot for several concurrency levels; CDFs of TTFT/TPOT/E2E for a single run."""
    if len(results) > 1:
        return plot_sweep(results, out)
    plt = _pyplot()
    r = results[0]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ok = [rec for rec in r.records if rec.ok]
    for ax, name, values in (
        (axes[0], "TTFT", [x.ttft_s for x in ok]),
        (axes[1], "TPOT", [x.tpot_s for x in ok]),
        (axes[2], "E2E", [x.e2e_s for x in ok]),
    ):
        ms = sorted(v * 1000.0 for v in values if v is not None)
        if ms:
            ax.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))])
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("share of requests")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"kvgate bench: {r.spec.workload} c={r.spec.concurrency}, "
                 f"{r.summary.output_tokens_per_s:,.0f} output tok/s")
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
