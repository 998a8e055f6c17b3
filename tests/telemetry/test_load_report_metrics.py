"""In-band load reports on /metrics: a whole reply from a sim that reports its load counts as applied."""

from __future__ import annotations

import httpx

from app.sim.testing import running_sim
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway


def test_a_whole_reply_with_the_sims_load_report_is_counted_per_replica() -> None:
    with running_sim(model="served-model", time_scale=50.0, profile="h100-8b") as sim:
        cfg = gateway_config([sim])
        with running_gateway(cfg) as gw:
            body = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            r = httpx.post(gw + "/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 200
            assert "endpoint-load-metrics" not in r.headers  # the engine's load stays inside
            text = httpx.get(gw + "/metrics").text
    line = f'gateway_replica_load_reports_total{{outcome="applied",pool="main",replica="{sim}"}} 1.0'
    assert line in text
