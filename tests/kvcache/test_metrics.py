"""KV-event intake metrics on /metrics, read from the hub a gateway builds for replicas that declare events."""

from __future__ import annotations

import httpx

from tests.conftest import gateway_config, running_gateway
from tests.servers import free_port


def test_a_replica_with_a_silent_event_endpoint_shows_as_not_whole(fake_upstream) -> None:
    _, url = fake_upstream
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = gateway_config([{"url": url, "kv_events": endpoint}])
    with running_gateway(cfg) as gw:
        text = httpx.get(gw + "/metrics").text
    assert f'gateway_kv_events_whole{{replica="{url}"}} 0.0' in text
    assert f'gateway_kv_events_received_total{{replica="{url}"}} 0.0' in text
    assert "gateway_kv_events_index_blocks 0.0" in text
    assert "gateway_kv_events_fallbacks_total 0.0" in text


def test_every_stream_counter_of_a_replica_is_exported_from_zero(fake_upstream) -> None:
    _, url = fake_upstream
    cfg = gateway_config([{"url": url, "kv_events": f"tcp://127.0.0.1:{free_port()}"}])
    with running_gateway(cfg) as gw:
        text = httpx.get(gw + "/metrics").text
    assert f'gateway_kv_events_batches_total{{replica="{url}"}} 0.0' in text
    assert f'gateway_kv_events_max_lag_seconds{{replica="{url}"}} 0.0' in text
    for kind in ("duplicate", "decode_error", "skipped_event", "restart", "replay_failure", "unrecoverable"):
        assert f'gateway_kv_events_stream_issues_total{{kind="{kind}",replica="{url}"}} 0.0' in text
