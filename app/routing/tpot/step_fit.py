"""Step time of a pool's engines as a function of decode batch size, fitted online from their /metrics.

Each scrape interval gives one point: the time-averaged decode batch (Δ inter-token-latency sum / Δt: every step
adds one observation of its duration per decoding sequence) and the mean step gap (Δsum / Δcount). The curve is
convex where it matters: flat while the step is memory-bound, steeper once it is compute-bound (and much steeper
on a speculative pool, where each sequence adds K draft rows). A local linear fit (Gaussian kernel in batch
size, bandwidth a quarter of the query's batch, at least 2) follows that bend without a model of it; outside the
observed range it extends the fit at the nearest edge by its slope (never negative: a bigger batch is not faster).

Hand-written: a window of ≤ 1024 points and one query per (pool, batch) between two scrapes (memoized) do not need
numpy; one query over 96 points takes ≈ 40 µs, a memo hit ≈ 0.1 µs (experiments/tpot_eval.py --micro).
"""

from __future__ import annotations

import math
from collections import deque


class StepFit:
    """Points (batch, step seconds); `predict(batch)` the step time at that decode batch size."""

    __slots__ = ("_memo", "_points", "_xmax", "_xmin")

    def __init__(self, window: int = 96) -> None:
        self._points: deque[tuple[float, float]] = deque(maxlen=window)
        self._memo: dict[int, float] = {}
        self._xmin = self._xmax = 0.0

    def __len__(self) -> int:
        return len(self._points)

    def add(self, batch: float, step_s: float) -> None:
        """One interval's time-averaged decode batch and mean step gap."""
        if batch <= 0 or step_s <= 0 or not math.isfinite(batch + step_s):
            return
        self._points.append((batch, step_s))
        xs = [x for x, _ in self._points]
        self._xmin, self._xmax = min(xs), max(xs)
        self._memo.clear()

    def clear(self) -> None:
        """Forget every point (the engine behind them is gone)."""
        self._points.clear()
        self._memo.clear()
        self._xmin = self._xmax = 0.0

    def predict(self, batch: int) -> float | None:
        """Step seconds at `batch` decoding sequences (None without points)."""
        found = self._memo.get(batch)
        if found is None:
            if not self._points:
                return None
            found = self._memo[batch] = self._evaluate(float(batch))
        return found

    def _evaluate(self, b: float) -> float:
        q = min(max(b, self._xmin), self._xmax)
        y, slope = self._local(q)
        return max(y + slope * (b - q), 1e-6)

    def _local(self, q: float) -> tuple[float, float]:
        """(fitted value, slope) at q from the points near it; the kernel widens until it holds ~2 points."""
        h = max(2.0, 0.25 * q)
        for _ in range(12):
            s0 = s1 = s2 = t0 = t1 = 0.0
            for x, y in self._points:
                z = (x - q) / h
                w = math.exp(-0.5 * z * z)
                s0 += w
                s1 += w * x
                s2 += w * x * x
                t0 += w * y
                t1 += w * x * y
            if s0 >= 2.0 or s0 >= len(self._points) * 0.999:
                break
            h *= 2.0
        mx, my = s1 / s0, t0 / s0
        var = s2 / s0 - mx * mx
        slope = (t1 / s0 - mx * my) / var if var > 1e-9 * max(mx * mx, 1.0) else 0.0
        slope = max(slope, 0.0)
        return my + slope * (q - mx), slope
