"""KV events on discovered pools: `discovery.kv_events` names each replica's endpoints by a `{host}` template; a
replica that appears gets a subscription in the hub, one that vanishes loses it (and its blocks), and the
kv_events policy routes on them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.api.app import create_app
from app.config import ConfigError, parse_config
from app.config.discovery import DiscoveredEvents
from app.routing.discovery import with_replicas
from app.sim.options import SimOptions
from app.sim.server import create_sim_app
from tests.routing.test_discovery import PRICE, Records, _port_free_on_both, _wait, serve
from tests.servers import free_port
from tests.sim.tiny_model import build_tiny_model

BS = 16


def config(dns: str, kv_events: dict[str, Any], **pool: Any) -> Any:
    main = {"role": "interactive", "served_model": "sim", "price": PRICE,
            "discovery": {"dns": dns, "kv_events": kv_events}, **pool}  # fmt: skip
    raw = {
        "models": [{"name": "m", "pools": ["main"]}],
        "pools": {"main": main},
        "routing": {"probe_interval_s": 0.1, "healthy_after": 1, "unhealthy_after": 1},
        "auth": {"required": False},
    }
    return parse_config(raw)


def test_each_discovered_replica_gets_its_endpoints_from_the_template_ipv6_in_brackets() -> None:
    cfg = config("pods:8000", {"endpoint": "tcp://{host}:5557", "replay": "tcp://{host}:5558"})
    found = with_replicas(cfg, {"main": ["http://10.0.0.1:8000", "http://[fd00::1]:8000"]}).pools["main"]
    assert found.replica_events["http://10.0.0.1:8000"].endpoint == "tcp://10.0.0.1:5557"
    assert found.replica_events["http://10.0.0.1:8000"].replay == "tcp://10.0.0.1:5558"
    assert found.replica_events["http://[fd00::1]:8000"].endpoint == "tcp://[fd00::1]:5557"
    assert found.replica_events["http://[fd00::1]:8000"].topic == "kv"
    assert DiscoveredEvents(endpoint="tcp://{host}:1").for_address("::1") == ("tcp://[::1]:1", None)


def test_an_endpoint_template_must_name_the_host_and_a_port() -> None:
    for bad in ("tcp://*:5557", "tcp://10.0.0.1:5557", "ipc:///tmp/kv", "tcp://{host}"):
        with pytest.raises(ConfigError):
            config("pods:8000", {"endpoint": bad})


def test_a_discovered_pool_with_kv_events_and_a_tokenizer_routes_by_kv_events_at_any_size() -> None:
    cfg = config("pods:8000", {"endpoint": "tcp://{host}:5557"}, tokenizer="/models/x")
    assert cfg.pools["main"].effective_policy().type == "kv_events"  # type: ignore[attr-defined]
    one = with_replicas(cfg, {"main": ["http://10.0.0.1:8000"]})
    assert one.pools["main"].effective_policy().type == "kv_events"  # type: ignore[attr-defined]
    without = config("pods:8000", {"endpoint": "tcp://{host}:5557"})
    assert without.pools["main"].effective_policy().type == "prefix_affinity"  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def test_a_discovered_replica_is_subscribed_when_it_appears_and_unsubscribed_when_it_vanishes(model: Path) -> None:
    port, pub, replay = _port_free_on_both(), free_port(), free_port()
    # The engine binds its PUB and replay sockets on every interface, as vLLM does with tcp://*:port.
    opts = SimOptions(model="sim", tokenizer=str(model), block_size=BS, kv_events=f"tcp://*:{pub}",
                      kv_replay=f"tcp://*:{replay}", kv_topic="kv", time_scale=50)  # fmt: skip
    cfg = config(f"replicas.test:{port}", {"endpoint": f"tcp://{{host}}:{pub}", "replay": f"tcp://{{host}}:{replay}"},
                 tokenizer=str(model), policy={"type": "kv_events", "block_size": BS})  # fmt: skip
    records = Records("127.0.0.1")
    app = create_app(cfg)
    gw = app.api.state.gateway
    gw.discoverer.pools["main"].source.resolver = records
    first, second = f"http://127.0.0.1:{port}", f"http://127.0.0.2:{port}"
    messages = [{"role": "user", "content": " ".join(f"Fact {i}: item {i} weighs {i * 7} g." for i in range(30))}]
    with (
        serve(create_sim_app(opts), "0.0.0.0", port),
        serve(app, "127.0.0.1", free_port()) as base,
    ):
        _wait(lambda: httpx.get(f"{base}/ready").status_code == 200)
        hub = gw.kv_hub
        assert hub is not None and hub.urls() == [first]
        _wait(lambda: hub.is_whole(first))
        time.sleep(0.3)  # ZMQ's slow joiner: the subscription must reach the engine's PUB before its next batch
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="EMPTY", max_retries=0, timeout=30)
        client.chat.completions.create(model="m", messages=messages, max_tokens=1)
        _wait(lambda: hub.index.size(first) > 0, timeout=5)
        again = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=1)
        assert "policy=kv_events;pick=kv_hit" in again.headers["x-kvgate-route"]
        records.addresses = ["127.0.0.2"]
        _wait(lambda: hub.urls() == [second])
        assert hub.index.size(first) == 0 and first not in hub.index.replicas(), "the vanished replica's blocks go"
        # The same engine answers on the new address (it binds every interface): caught up through its replay.
        _wait(lambda: hub.is_whole(second) and hub.index.size(second) > 0)
