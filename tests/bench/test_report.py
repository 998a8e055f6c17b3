"""Percentiles, goodput, throughput and dollar arithmetic of the summary."""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest

from app.bench.pricing import cost_summary, usd_per_m
from app.bench.report import BenchResult, Distribution, meets_slo, percentile, summarize
from app.bench.spec import BenchSpec, Pricing, RequestRecord


def _rec(i: int, *, ok: bool = True, ttft: float = 0.1, tpot: float | None = 0.02, e2e: float = 1.0,
         prompt: int = 100, cached: int = 0, output: int = 10) -> RequestRecord:
    return RequestRecord(index=i, session=i, turn=0, tenant=0, route_class="interactive", ok=ok,
                         ttft_s=ttft if ok else None, tpot_s=tpot if ok else None, e2e_s=e2e,
                         prompt_tokens=prompt, cached_tokens=cached, output_tokens=output,
                         usage_reported=ok, error=None if ok else "HTTP 500: boom")


@pytest.mark.parametrize("p", [0, 1, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear_interpolation(p: float) -> None:
    rng = random.Random(p)
    values = [rng.expovariate(1.0) for _ in range(257)]
    assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None
    assert Distribution.of_seconds([None, None]).p50 is None


def test_distribution_reports_milliseconds() -> None:
    d = Distribution.of_seconds([0.1, 0.2, 0.3])
    assert d.p50 == pytest.approx(200.0)
    assert d.mean == pytest.approx(200.0)
    assert d.count == 3


def test_meets_slo_checks_both_ttft_and_tpot() -> None:
    fast = _rec(0, ttft=0.1, tpot=0.02)
    slow_first = _rec(1, ttft=0.6, tpot=0.02)
    slow_decode = _rec(2, ttft=0.1, tpot=0.08)
    one_token = _rec(3, ttft=0.1, tpot=None)
    failed = _rec(4, ok=False)
    assert meets_slo(fast, 500, 50)
    assert not meets_slo(slow_first, 500, 50)
    assert not meets_slo(slow_decode, 500, 50)
    assert meets_slo(one_token, 500, 50)
    assert not meets_slo(failed, None, None)
    assert meets_slo(slow_decode, 500, None)


def test_summary_counts_throughput_goodput_and_cached_ratio() -> None:
    records = [_rec(0, ttft=0.1, prompt=100, cached=50, output=10),
               _rec(1, ttft=0.9, prompt=300, cached=150, output=30),
               _rec(2, ok=False)]
    spec = BenchSpec(base_url="http://x", slo_ttft_ms=500)
    s = summarize(records, wall_s=2.0, spec=spec)
    assert (s.requests, s.ok, s.errors) == (3, 2, 1)
    assert s.error_kinds == {"HTTP 500": 1}
    assert (s.prompt_tokens, s.cached_tokens, s.output_tokens) == (400, 200, 40)
    assert s.cached_ratio == pytest.approx(0.5)
    assert s.output_tokens_per_s == pytest.approx(40 / 2.0)
    assert s.total_tokens_per_s == pytest.approx(440 / 2.0)
    assert s.requests_per_s == pytest.approx(2 / 2.0)
    assert s.goodput_requests_per_s == pytest.approx(1 / 2.0)
    assert s.goodput_ratio == pytest.approx(1 / 3)


def test_summary_without_slo_reports_no_goodput() -> None:
    s = summarize([_rec(0)], wall_s=1.0, spec=BenchSpec(base_url="http://x"))
    assert s.goodput_requests_per_s is None and s.goodput_ratio is None


def test_usd_per_million_is_gpu_dollars_per_hour_over_tokens_per_second() -> None:
    # 2 GPUs at $2.50/h produce 1000 tokens/s: 3.6M tokens cost $5 → $1.3889/M.
    assert usd_per_m(2.5, 2, 1000.0) == pytest.approx(5.0 / 3.6)
    assert usd_per_m(2.5, 1, 0.0) is None


def test_cost_from_gpu_time_matches_per_million_reckoning_and_savings() -> None:
    p = Pricing(gpu_hour_usd=3.6, gpus=1, reference_input_per_m=3.0, reference_cached_input_per_m=0.3,
                reference_output_per_m=15.0)
    c = cost_summary(p, wall_s=100.0, uncached=600_000, cached=400_000, output=50_000)
    assert c.run_cost_usd == pytest.approx(0.1)
    assert c.usd_per_m_output == pytest.approx(usd_per_m(3.6, 1, 50_000 / 100.0))
    assert c.usd_per_m_total == pytest.approx(usd_per_m(3.6, 1, 1_050_000 / 100.0))
    reference = 0.6 * 3.0 + 0.4 * 0.3 + 0.05 * 15.0
    assert c.reference_cost_usd == pytest.approx(reference)
    assert c.savings_usd == pytest.approx(reference - 0.1)
    assert c.savings_ratio == pytest.approx((reference - 0.1) / reference)


def test_cost_from_explicit_token_prices_when_no_gpu_price() -> None:
    p = Pricing(input_per_m=1.0, cached_input_per_m=0.1, output_per_m=2.0)
    c = cost_summary(p, wall_s=10.0, uncached=1_000_000, cached=1_000_000, output=500_000)
    assert c.run_cost_usd == pytest.approx(1.0 + 0.1 + 1.0)


def test_cost_without_any_price_leaves_self_hosted_figures_empty() -> None:
    c = cost_summary(Pricing(), wall_s=10.0, uncached=1000, cached=0, output=100)
    assert c.run_cost_usd is None and c.usd_per_m_output is None and c.savings_usd is None
    assert c.reference_cost_usd > 0


def test_result_json_has_spec_summary_records_and_no_keys() -> None:
    spec = BenchSpec(base_url="http://x", api_key="sk-secret", api_keys=("sk-a", "sk-b"))
    result = BenchResult(spec=spec, records=[_rec(0)], summary=summarize([_rec(0)], 1.0, spec))
    text = result.to_json()
    doc = orjson.loads(text)
    assert set(doc) == {"spec", "summary", "records"}
    assert doc["summary"]["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert len(doc["records"]) == 1
    assert "sk-" not in text
    assert "records" not in orjson.loads(result.to_json(records=False))


def test_rescaled_converts_durations_and_throughput_to_the_target_clock() -> None:
    from app.bench.report import rescaled

    spec = BenchSpec(base_url="http://x", pricing=Pricing(gpu_hour_usd=1.0))
    records = [_rec(0, ttft=0.1, tpot=0.02, e2e=1.0, output=10), _rec(1, ttft=0.3, tpot=0.04, e2e=2.0, output=30)]
    records[0].itl_s = [0.02, 0.03]
    base = BenchResult(spec=spec, records=records, summary=summarize(records, 2.0, spec))
    slow = rescaled(base, 0.25)  # the sim ran 4x slower than its model: modeled time = wall x 0.25
    assert slow.spec.time_scale == 0.25
    assert slow.summary.wall_s == pytest.approx(0.5)
    assert slow.summary.ttft_ms.p50 == pytest.approx(base.summary.ttft_ms.p50 * 0.25)
    assert slow.summary.tpot_ms.p99 == pytest.approx(base.summary.tpot_ms.p99 * 0.25)
    assert slow.summary.itl_ms.mean == pytest.approx(base.summary.itl_ms.mean * 0.25)
    assert slow.summary.output_tokens_per_s == pytest.approx(base.summary.output_tokens_per_s / 0.25)
    assert slow.summary.cost.usd_per_m_output == pytest.approx(base.summary.cost.usd_per_m_output * 0.25)
    assert base.records[0].ttft_s == 0.1  # the original is untouched


def _stream(i: int, start: float, ttft: float, itl: list[float], output: int, *, warmup: bool = False,
            prompt: int = 10) -> RequestRecord:
    e2e = ttft + sum(itl)
    return RequestRecord(index=i, session=i, turn=0, tenant=0, route_class="interactive", start_s=start, ok=True,
                         ttft_s=ttft, e2e_s=e2e, itl_s=itl, output_tokens=output, token_chunks=len(itl) + 1,
                         prompt_tokens=prompt, usage_reported=True, warmup=warmup)


def test_steady_window_runs_from_first_measured_start_to_first_completion_after_last_issue() -> None:
    from app.bench.report import steady_window

    records = [
        _stream(0, start=0.0, ttft=1.0, itl=[1.0, 1.0, 1.0], output=4, warmup=True),  # tokens at 1, 2, 3, 4
        _stream(1, start=2.0, ttft=0.5, itl=[1.0], output=4),  # two chunks of two tokens, at 2.5 and 3.5
        _stream(2, start=3.6, ttft=1.5, itl=[1.0], output=2),  # last issue; tokens at 5.1 and 6.1
    ]
    w = steady_window(records)
    assert w is not None
    assert w.span_s == pytest.approx(2.0)  # [2.0, 4.0]: request 0 is the first to finish after the last issue
    assert w.output_tokens == pytest.approx(3 + 4)
    assert w.completed == 2  # requests 0 (at 4.0) and 1 (at 3.5)
    assert w.prompt_tokens == 10  # only request 1's first token falls inside
    s = summarize(records, wall_s=99.0, spec=BenchSpec(base_url="http://x"))
    assert s.output_tokens_per_s == pytest.approx(7 / 2.0)
    assert s.requests == 2 and s.output_tokens == 6  # latencies and totals cover the measured requests only


def test_steady_window_covers_a_whole_wave_when_requests_start_together() -> None:
    from app.bench.report import steady_window

    wave1 = [_stream(i, start=0.0, ttft=1.0, itl=[1.0] * 3, output=4, warmup=True) for i in range(2)]
    wave2 = [_stream(2 + i, start=4.0, ttft=1.0, itl=[1.0] * 3, output=4) for i in range(2)]
    w = steady_window(wave1 + wave2)
    assert w is not None
    assert w.span_s == pytest.approx(4.0)  # the second wave, from its start to its end
    assert w.output_tokens == pytest.approx(2 + 8)  # wave 1's last tokens at 4.0 fall inside too
    assert w.completed == 4
    s = summarize(wave1 + wave2, wall_s=99.0, spec=BenchSpec(base_url="http://x"))
    # Request rate = token rate / mean output length (completions bunch at the window's edge).
    assert s.requests_per_s == pytest.approx((10 / 4.0) / 4)


def test_no_warmup_means_throughput_over_the_whole_run() -> None:
    from app.bench.report import steady_window

    records = [_stream(0, start=0.0, ttft=1.0, itl=[1.0], output=2)]
    assert steady_window(records) is None
    assert summarize(records, wall_s=4.0, spec=BenchSpec(base_url="http://x")).output_tokens_per_s == 0.5
