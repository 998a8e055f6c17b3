"""Statistics of paired benchmark rounds: per-round ratios summarised as median [quartiles] and a bootstrap
interval of the median (experiments/admission_micro.py, experiments/house_cpu_paired.py)."""

from __future__ import annotations

import random
import statistics


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """Lower quartile, median, upper quartile."""
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


def bootstrap_median(xs: list[float], rng: random.Random, draws: int = 4000) -> tuple[float, float]:
    """95 % interval of the median of xs, resampling rounds."""
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]
