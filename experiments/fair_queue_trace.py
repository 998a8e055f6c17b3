"""Where a tenant's TTFT goes in experiments/fair_queue_eval.py: gateway queue, engine queue, prefill.

Per request, the gateway's own wait comes from `x-kvgate-route` (`queued=<ms>`); the rest of the TTFT is the
engine's (its FCFS waiting queue, then the step that prefills it). The engines' queue and prefill times are
vLLM histograms over all requests (the engine does not know tenants), read as deltas over the measured window.
A time series samples the sims' running/waiting and the gateway's cap and in-flight count while the arm runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from procs import metric_sum, parse_prom

from app.bench.report import percentile

LATENESS, MODELED = "kvgate_sim_step_lateness_seconds", "kvgate_sim_modeled_step_seconds"


@dataclass(frozen=True, slots=True)
class Sample:
    """One moment of an arm (modeled seconds since its start)."""

    at: float
    running: int
    waiting: int
    limit: float | None
    in_flight: float | None
    queue_len: float | None


async def trace_loop(session: aiohttp.ClientSession, sims: Sequence[str], gateway: str | None, t0: float,
                     every_s: float, ts: float, stop: asyncio.Event, out: list[Sample]) -> None:
    """Sample the sims' running/waiting and the gateway's queue gauges every `every_s` real seconds."""
    while not stop.is_set():
        running = waiting = 0
        for url in sims:
            m = await _metrics(session, url)
            running += int(metric_sum(m, "vllm:num_requests_running"))
            waiting += int(metric_sum(m, "vllm:num_requests_waiting"))
        g = await _metrics(session, gateway) if gateway else {}
        out.append(Sample((time.perf_counter() - t0) * ts, running, waiting, _gauge(g, "gateway_queue_limit"),
                          _gauge(g, "gateway_queue_in_flight"), _gauge(g, "gateway_queue_length")))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def _metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
        async with session.get(url + "/metrics") as resp:
            return parse_prom(await resp.text())
    return {}


def _gauge(m: dict[str, float], name: str) -> float | None:
    if not any(k.split("{", 1)[0] == name for k in m):
        return None
    return metric_sum(m, name)


def engine_means(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], ts: float) -> str:
    """Mean engine queue and prefill time (modeled ms) over the window, all requests of all sims."""
    parts = []
    for label, name in (("engine queue", "vllm:request_queue_time_seconds"),
                        ("engine prefill", "vllm:request_prefill_time_seconds")):
        s = sum(metric_sum(after[u], f"{name}_sum") - metric_sum(before[u], f"{name}_sum") for u in after)
        n = sum(metric_sum(after[u], f"{name}_count") - metric_sum(before[u], f"{name}_count") for u in after)
        parts.append(f"{label} mean {s / n * 1000 * ts:.1f} ms" if n else f"{label} -")
    # How far the sims' steps ran past their modeled end (the host's CPU): inflates every modeled time.
    late = sum(metric_sum(after[u], LATENESS) - metric_sum(before[u], LATENESS) for u in after)
    modeled = sum(metric_sum(after[u], MODELED) - metric_sum(before[u], MODELED) for u in after)
    if modeled > 0:
        parts.append(f"sim steps late {late * ts / modeled:.0%} of modeled step time")
    return ", ".join(parts)


def breakdown(records: Sequence[Any], tenant: str, ts: float, warmup: float) -> str:
    """Gateway wait vs the rest of the TTFT for one tenant's measured requests (modeled ms: mean/p50/p99)."""
    rs = [r for r in records if r.tenant == tenant and r.arrival >= warmup and r.ttft is not None
          and r.gateway_wait is not None and not r.rejected and r.error is None]
    if not rs:
        return f"{tenant}: no gateway waits recorded"
    gw = [r.gateway_wait * ts * 1000 for r in rs]
    engine = [(r.ttft - r.gateway_wait) * ts * 1000 for r in rs]
    queued = sum(1 for w in gw if w > 0)

    def stats(xs: list[float]) -> str:
        return f"{sum(xs) / len(xs):.1f}/{percentile(xs, 50):.1f}/{percentile(xs, 99):.1f}"

    slow = sorted(rs, key=lambda r: r.ttft, reverse=True)[: max(1, len(rs) // 20)]
    worst = ", ".join(f"{r.arrival:.1f}s:{r.gateway_wait * ts * 1000:.0f}+{(r.ttft - r.gateway_wait) * ts * 1000:.0f}"
                      for r in slow)
    return (
        f"{tenant}: gateway wait mean/p50/p99 {stats(gw)} ms ({queued}/{len(rs)} queued); after the gateway "
        f"(engine queue + prefill) {stats(engine)} ms; slowest 5% at arrival: wait+engine ms {worst}"
    )


def timeline(samples: Sequence[Sample], warmup: float) -> str:
    """The sampled series, compact: running/waiting in the sims, the gateway's limit/in-flight/queue."""
    rows = [s for s in samples if s.at >= warmup]
    if not rows:
        return "no samples"

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    return " ".join(f"{s.at:.1f}:{s.running}/{s.waiting}|{f(s.limit)}/{f(s.in_flight)}/{f(s.queue_len)}"
                    for s in rows)
