"""run_bench against a real loopback OpenAI-compatible server with known delays and usage."""

from __future__ import annotations

import re

import orjson
import pytest

from app.bench.runner import run_bench, run_sweep
from app.bench.spec import BenchSpec
from kvlab.fake_openai import BAD_KEY, FakeOpenAI, serving


async def test_streaming_run_measures_ttft_tpot_itl_and_usage() -> None:
    fake = FakeOpenAI(tokens=5, first_delay_s=0.05, token_delay_s=0.01, cached_tokens=16)
    async with serving(fake) as url:
        result = await run_bench(BenchSpec(base_url=url, workload="chat", concurrency=3, requests=9))
    s = result.summary
    assert (s.requests, s.ok, s.errors) == (9, 9, 0)
    assert result.spec.model == fake.model  # resolved from GET /v1/models
    assert all(r["body"]["model"] == fake.model for r in fake.received)
    assert all(r["body"]["stream_options"] == {"include_usage": True} for r in fake.received)
    # Lower bounds only: the server cannot send sooner than its delays.
    for rec in result.records:
        assert rec.ttft_s is not None and rec.ttft_s >= 0.05
        assert rec.tpot_s is not None and rec.tpot_s >= 0.01 * 0.9
        assert rec.e2e_s is not None and rec.e2e_s >= rec.ttft_s
        assert rec.tpot_s == pytest.approx((rec.e2e_s - rec.ttft_s) / (rec.output_tokens - 1))
        assert len(rec.itl_s) == rec.output_tokens - 1 == 4
        assert rec.usage_reported
    assert s.prompt_tokens == sum(u["prompt"] for u in fake.sent_usage)
    assert s.cached_tokens == sum(u["cached"] for u in fake.sent_usage)
    assert s.output_tokens == 9 * 5
    assert s.cached_ratio == pytest.approx(s.cached_tokens / s.prompt_tokens)
    assert s.ttft_ms.p50 is not None and s.ttft_ms.p50 >= 50


async def test_failed_requests_are_counted_as_errors_with_their_status() -> None:
    fake = FakeOpenAI(tokens=2, first_delay_s=0.0, token_delay_s=0.0)
    async with serving(fake) as url:
        spec = BenchSpec(base_url=url, model="fake-model", api_keys=("sk-good", BAD_KEY), concurrency=2,
                         requests=6)
        result = await run_bench(spec)
    s = result.summary
    assert (s.ok, s.errors) == (3, 3)
    assert s.error_kinds == {"HTTP 401": 3}
    failed = [r for r in result.records if not r.ok]
    assert all(r.status == 401 and r.tenant == 1 and "authentication_error" in (r.error or "") for r in failed)
    assert s.output_tokens == 3 * 2


async def test_connection_refused_is_an_error_not_a_crash() -> None:
    spec = BenchSpec(base_url="http://127.0.0.1:9", model="m", concurrency=1, requests=2, timeout_s=5)
    result = await run_bench(spec)
    assert result.summary.errors == 2
    assert all(r.status == 0 and r.error for r in result.records)


async def test_missing_usage_falls_back_to_counting_token_chunks() -> None:
    fake = FakeOpenAI(tokens=4, first_delay_s=0.0, token_delay_s=0.0, send_usage=False)
    async with serving(fake) as url:
        result = await run_bench(BenchSpec(base_url=url, concurrency=2, requests=4))
    assert result.summary.usage_missing == 4
    assert all(r.output_tokens == 4 and not r.usage_reported for r in result.records)


async def test_non_streaming_run_uses_body_usage() -> None:
    fake = FakeOpenAI(tokens=3, first_delay_s=0.02, token_delay_s=0.0)
    async with serving(fake) as url:
        result = await run_bench(BenchSpec(base_url=url, concurrency=2, requests=4, stream=False))
    assert result.summary.ok == 4
    assert all(not r["body"]["stream"] for r in fake.received)
    assert all(r.ttft_s == r.e2e_s and r.output_tokens == 3 and r.usage_reported for r in result.records)


async def test_agent_sessions_send_previous_replies_in_later_turns() -> None:
    fake = FakeOpenAI(tokens=3, first_delay_s=0.0, token_delay_s=0.0)
    async with serving(fake) as url:
        result = await run_bench(BenchSpec(base_url=url, workload="agent", concurrency=2, requests=10))
    assert result.summary.ok == 10
    later = [r["body"]["messages"] for r in fake.received if len(r["body"]["messages"]) > 2]
    assert later, "some sessions reached a second turn"
    assert all(m[2]["role"] == "assistant" and m[2]["content"] == "t0 t1 t2 " for m in later)
    turns_by_session: dict[int, list[int]] = {}
    for rec in result.records:
        turns_by_session.setdefault(rec.session, []).append(rec.turn)
    assert all(t == list(range(len(t))) for t in turns_by_session.values())


async def test_open_loop_rate_sends_the_requested_count() -> None:
    fake = FakeOpenAI(tokens=2, first_delay_s=0.0, token_delay_s=0.0)
    async with serving(fake) as url:
        result = await run_bench(BenchSpec(base_url=url, rate=200.0, requests=20))
    assert result.summary.ok == 20 and len(fake.received) == 20


async def test_open_loop_far_behind_schedule_still_sends_exactly_the_requested_count() -> None:
    fake = FakeOpenAI(tokens=1, first_delay_s=0.0, token_delay_s=0.0)
    async with serving(fake) as url:
        result = await run_bench(BenchSpec(base_url=url, rate=1e6, requests=25))
    assert len(result.records) == 25 and len(fake.received) == 25


async def test_duration_bound_stops_issuing() -> None:
    fake = FakeOpenAI(tokens=2, first_delay_s=0.01, token_delay_s=0.0)
    async with serving(fake) as url:
        result = await run_bench(BenchSpec(base_url=url, concurrency=2, duration_s=0.3))
    assert result.summary.ok >= 2
    assert result.summary.wall_s >= 0.3


async def test_gpu_price_gives_dollars_per_million_from_measured_throughput() -> None:
    from app.bench.spec import Pricing

    fake = FakeOpenAI(tokens=4, first_delay_s=0.0, token_delay_s=0.0)
    async with serving(fake) as url:
        result = await run_bench(BenchSpec(base_url=url, concurrency=2, requests=6,
                                           pricing=Pricing(gpu_hour_usd=2.0, gpus=1)))
    s = result.summary
    assert s.cost.usd_per_m_output == pytest.approx(2.0 / (3600 * s.output_tokens_per_s) * 1e6)
    assert s.cost.savings_usd == pytest.approx(s.cost.reference_cost_usd - 2.0 * s.wall_s / 3600)


async def test_sweep_runs_each_level_and_json_round_trips() -> None:
    fake = FakeOpenAI(tokens=2, first_delay_s=0.0, token_delay_s=0.0)
    async with serving(fake) as url:
        results = await run_sweep(BenchSpec(base_url=url, requests=4), [1, 3])
    assert [r.spec.concurrency for r in results] == [1, 3]
    doc = orjson.loads(results[1].to_json())
    assert doc["spec"]["concurrency"] == 3 and len(doc["records"]) == 4


async def test_warmup_requests_are_sent_but_left_out_of_the_summary() -> None:
    fake = FakeOpenAI(tokens=2, first_delay_s=0.0, token_delay_s=0.0)
    async with serving(fake) as url:
        result = await run_bench(BenchSpec(base_url=url, concurrency=2, requests=6, warmup=4))
    assert len(fake.received) == 10 and len(result.records) == 10
    assert [r.warmup for r in result.records] == [True] * 4 + [False] * 6
    assert result.summary.requests == 6 and result.summary.output_tokens == 6 * 2
    assert result.summary.wall_s > 0


async def test_several_base_urls_each_serve_whole_sessions_spread_over_them() -> None:
    fakes = [FakeOpenAI(tokens=2, first_delay_s=0.0, token_delay_s=0.0) for _ in range(2)]
    async with serving(fakes[0]) as first, serving(fakes[1]) as second:
        result = await run_bench(BenchSpec(base_url=first, more_base_urls=(second,), workload="agent",
                                           model="fake-model", concurrency=4, requests=16))  # fmt: skip
    assert result.summary.ok == 16
    sessions = [{int(re.search(r"Session ID: sess_(\d+)", r["body"]["messages"][0]["content"]).group(1))  # type: ignore[union-attr]
                 for r in fake.received} for fake in fakes]  # fmt: skip
    assert sessions[0] and sessions[1], "both gateways got sessions"
    assert all(s % 2 == 0 for s in sessions[0]) and all(s % 2 == 1 for s in sessions[1]), "each session on one URL"


async def test_the_cost_a_kvgate_gateway_bills_is_recorded_per_request_and_summed() -> None:
    from app.api.app import create_app
    from app.config import parse_config
    from app.sim.options import SimOptions
    from app.sim.server import create_sim_app
    from tests.servers import serve_in_thread

    pool = {"role": "interactive", "served_model": "served", "price": {"input_per_m": 1.0, "output_per_m": 2.0}}
    with serve_in_thread(create_sim_app(SimOptions(model="served"))) as sim:
        raw = {"models": [{"name": "m", "pools": ["main"]}], "pools": {"main": {**pool, "replicas": [sim]}},
               "auth": {"required": False}}  # fmt: skip
        cfg = parse_config(raw)
        with serve_in_thread(create_app(cfg)) as gateway:
            runs = [
                await run_bench(BenchSpec(base_url=gateway, api=api, model="m", concurrency=2, requests=4,
                                          max_tokens=4, stream=stream))
                for api in ("chat", "responses", "messages") for stream in (True, False)
            ]  # fmt: skip
    for result in runs:
        assert all(r.cost_usd is not None and r.cost_usd > 0 for r in result.records), result.spec.api
        assert result.summary.gateway_cost_usd == pytest.approx(sum(r.cost_usd or 0 for r in result.records))
