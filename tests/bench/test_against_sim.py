"""The bench against a real `kvgate sim`: the agent workload's volatile header defeats prefix caching."""

from __future__ import annotations

from app.bench.runner import run_bench
from app.bench.spec import BenchSpec
from app.sim.testing import running_sim


async def _cached_ratio(base: str, workload: str) -> float:
    spec = BenchSpec(base_url=base, workload=workload, concurrency=3, requests=12, max_tokens=8,
                     extra_body={"ignore_eos": True})
    result = await run_bench(spec)
    assert result.summary.errors == 0, result.summary.error_kinds
    assert result.summary.output_tokens == 12 * 8
    assert result.summary.cached_ratio is not None
    return result.summary.cached_ratio


async def test_agent_static_hits_the_prefix_cache_and_agent_does_not() -> None:
    with running_sim(profile="h100-8b", time_scale=50.0) as base:
        volatile = await _cached_ratio(base, "agent")
    with running_sim(profile="h100-8b", time_scale=50.0) as base:
        static = await _cached_ratio(base, "agent-static")
    assert volatile < 0.1  # only the template's first block(s) before the timestamp can match
    assert static > 0.7
