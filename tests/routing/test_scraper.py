from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from app.routing.scraper import Scraper
from app.routing.state import ClusterState
from tests.routing.factory import make_config

FIXTURE = (Path(__file__).parent / "fixtures" / "vllm_metrics.txt").read_text()


@dataclass
class FakeReplica:
    """A loopback HTTP server answering /health and /metrics like vLLM, with a switchable health."""

    healthy: bool = True
    metrics: str = FIXTURE
    health_calls: int = 0
    runner: web.AppRunner | None = None
    url: str = ""
    log: list[bool] = field(default_factory=list)

    async def health(self, _: web.Request) -> web.Response:
        self.health_calls += 1
        self.log.append(self.healthy)
        return web.Response(status=200 if self.healthy else 503)

    async def metrics_page(self, _: web.Request) -> web.Response:
        return web.Response(text=self.metrics, content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_page)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
async def replica() -> AsyncIterator[FakeReplica]:
    fake = FakeReplica()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def wait_for(predicate: Callable[[], bool]) -> None:
    """Poll until `predicate` holds; a bounded wait so a regression fails instead of hanging."""
    # Polling on purpose: the scraper exposes plain state, not events, and the test must not add any.
    async with asyncio.timeout(3.0):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_probe_reads_health_and_vllm_metrics(replica: FakeReplica, session: aiohttp.ClientSession) -> None:
    cfg = make_config(fast=[replica.url], bulk=[])
    cluster = ClusterState.from_config(cfg)
    state = cluster.pools["fast"].replicas[0]
    await Scraper(cluster, session, cfg.routing).probe_once(state)
    assert state.healthy
    assert (state.running, state.waiting, state.load()) == (5, 1, 6)
    assert abs(state.kv_usage - 0.105) < 1e-9
    assert state.counters["vllm:prefix_cache_hits"] == 1024
    assert state.last_scrape > 0


async def test_replica_leaves_and_returns_after_consecutive_good_probes(
    replica: FakeReplica, session: aiohttp.ClientSession
) -> None:
    cfg = make_config(
        fast=[replica.url], bulk=[], routing={"probe_interval_s": 0.02, "healthy_after": 3, "unhealthy_after": 2}
    )
    cluster = ClusterState.from_config(cfg)
    state = cluster.pools["fast"].replicas[0]
    scraper = Scraper(cluster, session, cfg.routing)
    await scraper.start()
    try:
        await wait_for(lambda: state.last_scrape > 0)
        mark = len(replica.log)
        replica.healthy = False
        await wait_for(lambda: not state.healthy)
        assert replica.log[mark:].count(False) >= 2  # left after two bad probes, not one
        assert state.load() == 0  # stale load forgotten
        mark = len(replica.log)
        replica.healthy = True
        await wait_for(lambda: state.healthy)
        assert replica.log[mark:].count(True) >= 3  # back only after three good probes in a row
        await wait_for(lambda: state.running == 5)
    finally:
        await scraper.stop()


async def test_unreachable_replica_goes_unhealthy(session: aiohttp.ClientSession) -> None:
    fake = FakeReplica()
    await fake.start()
    url = fake.url
    await fake.stop()  # nothing listens there any more
    cfg = make_config(fast=[url], bulk=[])
    cluster = ClusterState.from_config(cfg)
    state = cluster.pools["fast"].replicas[0]
    await Scraper(cluster, session, cfg.routing).probe_once(state)
    assert not state.healthy
    assert state.last_error is not None and state.last_error.startswith("health ")


async def test_healthy_replica_without_metrics_keeps_serving_on_in_flight_counts(
    session: aiohttp.ClientSession,
) -> None:
    fake = FakeReplica(metrics="")
    app = web.Application()
    app.router.add_get("/health", fake.health)  # no /metrics route: 404
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        cfg = make_config(fast=[f"http://127.0.0.1:{port}"], bulk=[])
        cluster = ClusterState.from_config(cfg)
        state = cluster.pools["fast"].replicas[0]
        state.on_start()
        await Scraper(cluster, session, cfg.routing).probe_once(state)
        assert state.healthy and state.load() == 1
    finally:
        await runner.cleanup()


async def test_stop_ends_every_task(replica: FakeReplica, session: aiohttp.ClientSession) -> None:
    cfg = make_config(fast=[replica.url], bulk=[replica.url], routing={"probe_interval_s": 0.02})
    scraper = Scraper(ClusterState.from_config(cfg), session, cfg.routing)
    await scraper.start()
    await scraper.start()  # idempotent: still one task per replica
    tasks = list(scraper._tasks.values())
    assert len(tasks) == 2
    await wait_for(lambda: replica.health_calls >= 4)
    await scraper.stop()
    assert all(t.done() for t in tasks)
    # A request sent just before the cancel may still reach the server's handler; after that, silence.
    await asyncio.sleep(0.05)
    calls = replica.health_calls
    await asyncio.sleep(0.15)
    assert replica.health_calls == calls
