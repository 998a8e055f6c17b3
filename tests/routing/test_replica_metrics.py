"""Per-replica observations on /metrics: in-band load reports, and replicas per pool by routing state."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.routing.state import REPLICA_STATUSES
from app.sim.testing import running_sim
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway
from tests.servers import free_port


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


def _replicas_by_state(gw: str) -> dict[str, float]:
    text = httpx.get(gw + "/metrics").text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "gateway_pool_replicas")
    return {s.labels["state"]: s.value for s in family.samples if s.labels["pool"] == "main"}


def test_replicas_are_counted_per_pool_by_state_zeros_included() -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: its first probe fails
    with running_sim(model="served-model", time_scale=50.0, profile="h100-8b") as sim, \
            running_gateway(gateway_config([sim, dead])) as gw:  # fmt: skip
        deadline = time.monotonic() + 15
        while (states := _replicas_by_state(gw)).get("unhealthy") != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert states == {**dict.fromkeys(REPLICA_STATUSES, 0.0), "serving": 1.0, "unhealthy": 1.0}
