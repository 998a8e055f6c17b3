"""`kvgate bench --api responses|messages` against a real `kvgate sim`: usage and cached tokens from each API."""

from __future__ import annotations

import pytest

from app.bench.runner import run_bench
from app.bench.spec import BenchSpec
from app.sim.testing import running_sim


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
@pytest.mark.parametrize("stream", [True, False])
async def test_agent_static_workload_reads_cached_tokens_through_each_api(api: str, stream: bool) -> None:
    with running_sim(profile="h100-8b", time_scale=50.0) as base:
        spec = BenchSpec(base_url=base, api=api, workload="agent-static", concurrency=3, requests=9, max_tokens=6,
                         stream=stream, extra_body={"ignore_eos": True})
        result = await run_bench(spec)
    s = result.summary
    assert s.errors == 0, s.error_kinds
    assert s.output_tokens == 9 * 6
    assert s.cached_ratio is not None and s.cached_ratio > 0.7
    if stream:
        assert all(r.ttft_s is not None and r.token_chunks >= 1 for r in result.records)


async def test_the_volatile_agent_header_defeats_the_cache_on_the_new_apis_too() -> None:
    ratios = {}
    for api in ("responses", "messages"):
        with running_sim(profile="h100-8b", time_scale=50.0) as base:
            spec = BenchSpec(base_url=base, api=api, workload="agent", concurrency=3, requests=9, max_tokens=4,
                             extra_body={"ignore_eos": True})
            result = await run_bench(spec)
        assert result.summary.errors == 0, result.summary.error_kinds
        ratios[api] = result.summary.cached_ratio
    assert all(r is not None and r < 0.1 for r in ratios.values()), ratios
