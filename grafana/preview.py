"""Render a dashboard's panels from a live Prometheus into a PNG, laid out like Grafana lays them out.

Not a Grafana screenshot (Grafana is not installable where kvgate is developed): the same queries, the same
grid, plotted with matplotlib, so the dashboard can be looked at without a Grafana server.
    python grafana/preview.py --prometheus http://127.0.0.1:9090 --minutes 10 \
        grafana/dashboards/kvgate-cost.json docs/img/kvgate-cost-preview.png
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # the backend is chosen above, before pyplot loads
from matplotlib.axes import Axes

ROW_INCH = 0.42  # one Grafana grid unit of height
WIDTH_INCH = 22.0
HEADER_INCH = 0.8  # the dashboard title's band above the grid
LEFT_PAD = 0.03  # of the figure's width, left of each panel's plot: the y tick labels and unit


def substitute(expr: str, window_s: int) -> str:
    """Grafana's variables for an all-tenants, all-pools view of the last `window_s` seconds."""
    values = {"$__rate_interval": "1m", "$__range": f"{window_s}s", "$__interval": "15s", "$tenant": ".*"}
    for var, value in values.items():
        expr = expr.replace(var, value)
    return expr.replace("$pool", ".*")


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's `{{label}}` legend templating."""
    if not fmt or fmt == "__auto":
        return ", ".join(f"{k}={v}" for k, v in labels.items() if k != "__name__") or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def fmt_value(v: float, unit: str) -> str:
    """A number in the panel's unit."""
    if not math.isfinite(v):
        return "n/a"
    if unit == "currencyUSD":
        return f"${v:,.4f}" if abs(v) < 1 else f"${v:,.2f}"
    if unit == "percentunit":
        return f"{100 * v:.1f}%"
    if unit == "s":
        return f"{1000 * v:.1f} ms" if v < 1 else f"{v:.2f} s"
    if unit == "reqps":
        return f"{v:.2f} req/s"
    return f"{v:,.3g}"


class Prom:
    """The two Prometheus HTTP API calls the preview needs."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")

    def instant(self, expr: str) -> list[dict[str, Any]]:
        """Instant query at now."""
        r = httpx.post(f"{self.base}/api/v1/query", data={"query": expr}, timeout=20)
        return list(r.json()["data"]["result"])

    def range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Range query."""
        data = {"query": expr, "start": start, "end": end, "step": step}
        r = httpx.post(f"{self.base}/api/v1/query_range", data=data, timeout=20)
        return list(r.json()["data"]["result"])


def draw_timeseries(ax: Axes, prom: Prom, panel: dict[str, Any], window_s: int) -> None:
    """Lines over the window; stacked, with the band under each line filled, when the panel stacks."""
    end = time.time()
    start = end - window_s
    step = max(window_s / 120, 1)
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    stacked = panel["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode") == "normal"
    top: dict[float, float] = {}  # stacked: each timestamp's running total, the next series' floor
    for t in panel["targets"]:
        for series in prom.range(substitute(t["expr"], window_s), start, end, step):
            stamps = [float(ts) for ts, _ in series["values"]]
            xs = [(ts - end) / 60 for ts in stamps]
            ys = [float(v) * (100 if unit == "percentunit" else 1) for _, v in series["values"]]
            label = legend(t.get("legendFormat", ""), series["metric"])
            if not stacked:
                ax.plot(xs, ys, linewidth=1.2, label=label)
                continue
            floor = [top.get(ts, 0.0) for ts in stamps]
            ys = [f + y for f, y in zip(floor, ys, strict=True)]
            top.update(zip(stamps, ys, strict=True))
            (line,) = ax.plot(xs, ys, linewidth=1.0, label=label)
            ax.fill_between(xs, floor, ys, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlim(-window_s / 60, 0)  # the whole range, as Grafana shows it, also for series that start late
    ax.set_xlabel("minutes ago", fontsize=7)
    ax.set_ylabel(
        {"percentunit": "%", "currencyUSD": "USD", "s": "seconds", "reqps": "req/s"}.get(unit, ""), fontsize=7
    )
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=6, loc="upper left", ncol=2, framealpha=0.6)
    else:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)


def draw_stat(ax: Axes, prom: Prom, panel: dict[str, Any], window_s: int) -> None:
    """The big number."""
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    t = panel["targets"][0]
    result = prom.instant(substitute(t["expr"], window_s))
    if len(result) == 1:
        text = fmt_value(float(result[0]["value"][1]), unit)
    else:  # one value per series, as Grafana's stat panel tiles them
        parts = [
            f"{legend(t.get('legendFormat', ''), s['metric'])}: {fmt_value(float(s['value'][1]), unit)}" for s in result
        ]
        text = "    ".join(parts) or "No data"
    size = 22 if len(result) <= 1 else 14
    ax.text(0.5, 0.45, text, ha="center", va="center", fontsize=size, color="#2e7d32", transform=ax.transAxes)
    ax.axis("off")


def draw_bargauge(ax: Axes, prom: Prom, panel: dict[str, Any], window_s: int) -> None:
    """Horizontal bars, one per series."""
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    t = panel["targets"][0]
    result = prom.instant(substitute(t["expr"], window_s))
    names = [legend(t.get("legendFormat", ""), s["metric"]) for s in result]
    values = [float(s["value"][1]) for s in result]
    ax.barh(names, values, color="#f9a825")
    for i, v in enumerate(values):
        ax.text(v, i, " " + fmt_value(v, unit), va="center", fontsize=8)
    finite = [v for v in values if math.isfinite(v)]
    if finite and max(finite) > 0:
        ax.set_xlim(0, 1.12 * max(finite))  # room right of the longest bar for its value
    if not values:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)
    ax.invert_yaxis()
    ax.tick_params(labelsize=8)
    ax.set_xticks([])


def render(dashboard: dict[str, Any], prom: Prom, window_s: int, out: Path) -> None:
    """Every panel of the dashboard into one PNG."""
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    height = bottom * ROW_INCH + HEADER_INCH
    fig = plt.figure(figsize=(WIDTH_INCH, height))
    # In the header band: suptitle's default height is a share of the figure, inside the first row on a tall one.
    title = f"{dashboard['title']}  (last {window_s // 60} min, all tenants, all pools)"
    fig.suptitle(title, fontsize=14, y=1 - 0.5 * HEADER_INCH / height, va="center")
    top = 1 - HEADER_INCH / height
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        x0, w = g["x"] / 24, g["w"] / 24
        y0, h = top * (1 - (g["y"] + g["h"]) / bottom), top * g["h"] / bottom
        if panel["type"] == "row":
            fig.text(0.005, y0 + h / 2, panel["title"], fontsize=12, weight="bold", va="center")
            continue
        # A fixed left margin (not a share of the panel's width): a narrow panel's tick labels need as much room.
        ax = fig.add_axes((x0 + LEFT_PAD, y0 + 0.16 * h, w - LEFT_PAD - 0.008, 0.70 * h))
        ax.set_title(panel["title"], fontsize=9, loc="left")
        {"timeseries": draw_timeseries, "stat": draw_stat, "bargauge": draw_bargauge}[panel["type"]](
            ax, prom, panel, window_s
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    """CLI entry."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dashboard", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--prometheus", default="http://127.0.0.1:9090")
    p.add_argument("--minutes", type=int, default=15)
    args = p.parse_args(argv)
    render(json.loads(args.dashboard.read_text()), Prom(args.prometheus), args.minutes * 60, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
