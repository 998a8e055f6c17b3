"""Through a real gateway on two sims: the router learns from /metrics and streams, and says what decided."""

from __future__ import annotations

import time

import httpx
import pytest

from app.config import parse_config
from app.sim.testing import running_sim
from tests.conftest import running_gateway

pytestmark = pytest.mark.slow

PRICE = {"input_per_m": 1.0, "cached_input_per_m": 0.1, "output_per_m": 2.0}
CODE = "Rename x to y and return the function.\n```python\ndef f(x):\n    return x + 1\n```"


def _stream(client: httpx.Client, content: str) -> tuple[str, int]:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 48, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        n = sum(1 for line in resp.iter_lines() if line.startswith("data: "))
        return resp.headers["x-kvgate-route"], n


def _gauge(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_after_a_few_scrapes_streams_carry_the_prediction_and_code_is_expected_to_accept_more() -> None:
    with running_sim(model="s", speculative="ngram:4:0.2", spec_accept_when=("```=0.9",)) as fast, \
            running_sim(model="s") as bulk:
        cfg = parse_config(
            {"models": [{"name": "m", "pools": ["fast", "bulk"]}],
             "pools": {"fast": {"role": "interactive", "served_model": "s", "replicas": [fast], "price": PRICE},
                       "bulk": {"role": "bulk", "served_model": "s", "replicas": [bulk], "price": PRICE}},
             "auth": {"required": False}, "routing": {"probe_interval_s": 0.1, "healthy_after": 1}},
        )
        with running_gateway(cfg) as gw, httpx.Client(base_url=gw, timeout=30) as client:
            header = ""
            deadline = time.monotonic() + 60
            while ";tpot=" not in header and time.monotonic() < deadline:
                for content in (CODE, "Why is the sky blue?"):
                    header, _ = _stream(client, content)
                bulk_body = {"model": "m", "messages": [{"role": "user", "content": "report"}], "max_tokens": 24,
                             "service_tier": "flex"}
                assert client.post("/v1/chat/completions", json=bulk_body).status_code == 200
            assert ";tpot=" in header and ";kind=prose" in header and ";fast=" in header and ";bulk=" in header
            for _ in range(6):
                _stream(client, CODE)
                _stream(client, "Tell me about the sea.")
            metrics = client.get("/metrics").text
    code = _gauge(metrics, "gateway_spec_tokens_per_step", pool="fast", tenant="anonymous", kind="code")
    prose = _gauge(metrics, "gateway_spec_tokens_per_step", pool="fast", tenant="anonymous", kind="prose")
    assert code is not None and prose is not None and code > 1.5 * prose
    assert (_gauge(metrics, "gateway_spec_acceptance_ratio", pool="fast") or 0) > 0.2
    assert (_gauge(metrics, "gateway_tpot_compared_total", pool="fast") or 0) >= 1
