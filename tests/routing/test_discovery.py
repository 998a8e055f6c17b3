"""Replica discovery: DNS records and EndpointSlices become replica URLs; a change rebuilds the cluster, new
replicas join after a good probe, vanished ones drain; a failing source keeps the last known replicas."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.api.app import create_app
from app.config import parse_config
from app.config.discovery import KubernetesSelector
from app.config.policies import PrefixAffinityParams
from app.routing.discovery import (
    Discoverer,
    DiscoveryError,
    DnsSource,
    KubernetesSource,
    endpoint_urls,
    replica_url,
    system_resolver,
    with_replicas,
)
from app.routing.state import ClusterState
from tests.servers import FakeUpstream, free_port, running

PRICE = {"input_per_m": 1.0, "output_per_m": 2.0}


def discovering_config(dns: str, **extra: Any) -> Any:
    pool = {"role": "interactive", "served_model": "served-model", "discovery": {"dns": dns}, "price": PRICE}
    raw = {
        "models": [{"name": "m", "pools": ["main"]}],
        "pools": {"main": pool},
        "routing": {"probe_interval_s": 0.1, "healthy_after": 1, "unhealthy_after": 1},
        "auth": {"required": False},
        **extra,
    }
    return parse_config(raw)


class Records:
    """A resolver whose answers the test sets (or makes fail)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.fail = False
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append((host, port))
        if self.fail:
            raise DiscoveryError("SERVFAIL")
        return list(self.addresses)


# --- sources ------------------------------------------------------------------------------------------


async def test_dns_records_become_sorted_distinct_urls_ipv6_in_brackets() -> None:
    records = Records("10.0.0.2", "10.0.0.1", "10.0.0.2", "fd00:0:0:0:0:0:0:1")
    src = DnsSource("vllm-fast-pods.kvgate.svc", 8000, "http", records)
    assert await src.urls() == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::1]:8000"]
    assert records.asked == [("vllm-fast-pods.kvgate.svc", 8000)]


async def test_the_machine_resolver_finds_localhost() -> None:
    urls = await DnsSource("localhost", 8123).urls()
    assert urls and set(urls) <= {"http://127.0.0.1:8123", "http://[::1]:8123"}


async def test_a_name_that_does_not_resolve_is_a_discovery_error() -> None:
    with pytest.raises(DiscoveryError):
        await system_resolver("no-such-host.invalid", 80)


def test_replica_url_brackets_only_ipv6() -> None:
    assert replica_url("https", "10.1.2.3", 443) == "https://10.1.2.3:443"
    assert replica_url("http", "::1", 80) == "http://[::1]:80"


def test_endpointslices_give_ready_non_terminating_addresses_on_the_named_port() -> None:
    slices = [
        {
            "ports": [{"name": "http", "port": 8000}, {"name": "metrics", "port": 9000}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.2"], "conditions": {}},  # no `ready`: the API means ready
                {"addresses": ["10.0.0.3"], "conditions": {"ready": False}},
                {"addresses": ["10.0.0.4"], "conditions": {"ready": True, "terminating": True}},
            ],
        },
        {"ports": [{"name": "http", "port": 8001}], "endpoints": [{"addresses": ["10.0.1.1"]}]},
        {"ports": [{"name": "other", "port": 1}], "endpoints": [{"addresses": ["10.0.2.1"]}]},
    ]
    assert endpoint_urls(slices, "http") == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.1.1:8001"]
    assert endpoint_urls(slices, 8000)[0] == "http://10.0.0.1:8000"


@contextmanager
def fake_kubernetes_api(slices: list[dict[str, Any]]) -> Iterator[tuple[str, list[Request]]]:
    """An HTTP server answering the EndpointSlice list call as the API server does."""
    seen: list[Request] = []

    async def endpointslices(request: Request) -> JSONResponse:
        seen.append(request)
        return JSONResponse({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                             "metadata": {"resourceVersion": "1"}, "items": slices})  # fmt: skip

    app = Starlette(routes=[Route("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", endpointslices)])
    with serve(app, "127.0.0.1", free_port()) as url:
        yield url, seen


async def test_kubernetes_source_lists_endpointslices_by_label_selector_through_the_client() -> None:
    from kubernetes_asyncio import client

    slices = [
        {
            "metadata": {"name": "vllm-fast-pods-abcde", "labels": {"kubernetes.io/service-name": "vllm-fast-pods"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.0.0.7"], "conditions": {"ready": True, "serving": True, "terminating": False}},
                {"addresses": ["10.0.0.8"], "conditions": {"ready": False, "serving": True, "terminating": True}},
            ],
        }
    ]
    with fake_kubernetes_api(slices) as (url, seen):
        api_client = client.ApiClient(client.Configuration(host=url))
        selector = KubernetesSelector(
            namespace="kvgate", label_selector="kubernetes.io/service-name=vllm-fast-pods", port="http"
        )
        src = KubernetesSource(selector, api_client=api_client)
        try:
            assert await src.urls() == ["http://10.0.0.7:8000"]
        finally:
            await src.aclose()
    assert seen[0].path_params["ns"] == "kvgate"
    assert seen[0].query_params["labelSelector"] == "kubernetes.io/service-name=vllm-fast-pods"


async def test_kubernetes_source_that_cannot_reach_the_api_is_a_discovery_error() -> None:
    from kubernetes_asyncio import client

    api_client = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{free_port()}"))
    selector = KubernetesSelector(namespace="kvgate", label_selector="app=x", port=8000)
    src = KubernetesSource(selector, api_client=api_client)
    try:
        with pytest.raises(DiscoveryError):
            await src.urls()
    finally:
        await src.aclose()


# --- the discoverer -----------------------------------------------------------------------------------


async def test_a_change_hands_over_a_config_with_the_found_replicas_and_none_without_change() -> None:
    cfg = discovering_config("pods.test:8000")
    records = Records("10.0.0.1")
    seen: list[Any] = []
    disc = Discoverer(cfg, {"main": DnsSource("pods.test", 8000, "http", records)}, seen.append)
    assert await disc.refresh()
    assert seen[-1].pools["main"].replicas == ["http://10.0.0.1:8000"]
    assert not await disc.refresh()  # same answer: nothing rebuilt
    records.addresses = ["10.0.0.2", "10.0.0.1"]
    assert await disc.refresh()
    assert seen[-1].pools["main"].replicas == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert len(seen) == 2 and disc.pools["main"].changes == 2


async def test_a_failing_source_keeps_the_last_known_replicas() -> None:
    cfg = discovering_config("pods.test:8000")
    records = Records("10.0.0.1", "10.0.0.2")
    seen: list[Any] = []
    disc = Discoverer(cfg, {"main": DnsSource("pods.test", 8000, "http", records)}, seen.append)
    await disc.refresh()
    records.fail = True
    assert not await disc.refresh()
    assert disc.pools["main"].urls == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert disc.pools["main"].errors == 1 and len(seen) == 1


def test_a_rebuild_keeps_survivors_state_and_new_replicas_wait_for_a_probe() -> None:
    cfg = discovering_config("pods.test:8000")
    first = ClusterState.from_config(with_replicas(cfg, {"main": ["http://10.0.0.1:8000"]}))
    survivor = first.pools["main"].replicas[0]
    survivor.on_start()
    second = ClusterState.from_config(
        with_replicas(cfg, {"main": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]}), first,
        probe_before_joining=True,
    )  # fmt: skip
    kept, new = second.pools["main"].replicas
    assert kept is survivor and kept.in_flight == 1 and kept.available()
    assert not new.available()
    new.apply_probe(True, healthy_after=3, unhealthy_after=2)
    assert new.available(), "the first good probe lets a discovered replica in"


def test_a_discovered_pool_routes_by_prefix_affinity_whatever_its_size() -> None:
    cfg = discovering_config("pods.test:8000")
    assert isinstance(cfg.pools["main"].effective_policy(), PrefixAffinityParams)
    one = with_replicas(cfg, {"main": ["http://10.0.0.1:8000"]})
    assert isinstance(one.pools["main"].effective_policy(), PrefixAffinityParams)


# --- the gateway, end to end --------------------------------------------------------------------------


@contextmanager
def serve(app: Any, host: str, port: int) -> Iterator[str]:
    """uvicorn on `host:port` in a thread."""
    config = uvicorn.Config(app, host=host, port=port, log_level="error", loop="asyncio", timeout_graceful_shutdown=1)
    with running(config) as url:
        yield url


def _port_free_on_both() -> int:
    for _ in range(20):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.2", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no port free on 127.0.0.1 and 127.0.0.2")


def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_gateway_follows_dns_a_vanished_replica_drains_its_stream_and_a_new_one_joins() -> None:
    port = _port_free_on_both()
    one, two = FakeUpstream(), FakeUpstream()
    records = Records("127.0.0.1")
    cfg = discovering_config(f"replicas.test:{port}")
    app = create_app(cfg)
    gw = app.api.state.gateway
    assert gw.discoverer is not None
    gw.discoverer.pools["main"].source.resolver = records
    with (
        serve(one.app(), "127.0.0.1", port),
        serve(two.app(), "127.0.0.2", port),
        serve(app, "127.0.0.1", free_port()) as base,
    ):
        _wait(lambda: httpx.get(f"{base}/ready").status_code == 200)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="EMPTY", max_retries=0, timeout=30)
        # A long stream on the only replica, then DNS lists only the other one.
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "mode:drip"}], stream=True, max_tokens=100
        )
        chunks = iter(stream)
        for _ in range(3):
            next(chunks)
        records.addresses = ["127.0.0.2"]
        _wait(lambda: [r.url for r in gw.cluster.replicas()] == [f"http://127.0.0.2:{port}"])
        _wait(lambda: gw.cluster.pools["main"].replicas[0].available())
        # The vanished replica's stream goes on; new requests go to the new replica.
        for _ in range(5):
            assert next(chunks).choices is not None
        stream.close()
        before = len(two.seen)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert reply.choices[0].message.content
        assert len(two.seen) == before + 1 and len(one.seen) == 1
        metrics = httpx.get(f"{base}/metrics").text
        assert 'gateway_discovery_replicas{pool="main"} 1' in metrics
        assert 'gateway_discovery_changes_total{pool="main"} 2' in metrics


def test_gateway_with_discovery_is_unready_until_a_replica_is_found() -> None:
    records = Records()
    records.fail = True
    app = create_app(discovering_config("replicas.test:9"))
    app.api.state.gateway.discoverer.pools["main"].source.resolver = records
    with serve(app, "127.0.0.1", free_port()) as base:
        r = httpx.get(f"{base}/ready")
        assert r.status_code == 503 and r.json()["models_without_replica"] == ["m"]
        assert asyncio.run(_no_event_loop_blocked()) is None


async def _no_event_loop_blocked() -> None:
    # system_resolver goes through the loop's executor: other tasks run while it waits.
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    t = asyncio.create_task(tick())
    try:
        await system_resolver("localhost", 80)
    finally:
        t.cancel()
    assert ticks >= 1
