"""Prometheus text as the lab reads it: series with their labels, and sums over label matches (shared by tests/
and experiments/)."""

from __future__ import annotations


def parse_prom(text: str) -> dict[str, float]:
    """Prometheus text → {series name with labels: value} (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def metric_sum(sample: dict[str, float], name: str, **labels: str) -> float:
    """Sum of every series of `name` whose labels include `labels`."""
    total = 0.0
    for key, value in sample.items():
        base = key.split("{", 1)[0]
        if base != name:
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total
