"""The warmer: a replica that becomes healthy is held out of rotation while it replays its share of the top
prefixes (bounded: count, concurrency, budget), then joins; a failure, a bad probe or its leaving lets it go."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.config import parse_config
from app.config.prewarm import PrewarmConfig
from app.prewarm.memory import PrefixMemory
from app.prewarm.warmer import REPLAY_OUTCOMES, RUN_RESULTS, Prewarmer, home_of
from app.routing.state import ClusterState, ReplicaState
from app.surfaces import CHAT
from tests.servers import free_port, serve_in_thread

PRICE = {"input_per_m": 1.0, "output_per_m": 2.0}
SECRET_TEXT = "the-tenant's-secret-system-prompt"
OTHER = "http://127.0.0.1:9"  # a replica in rotation beside the joining one (never sent anything here)


@dataclass
class Engine:
    """A chat endpoint that records what it got, answers after `delay_s` with `status`, and counts concurrency."""

    status: int = 200
    delay_s: float = 0.0
    max_messages: int | None = None  # longer conversations get a 400 (beyond the context, say)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    active: int = 0
    peak: int = 0

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.bodies.append(body)
            self.active += 1
            self.peak = max(self.peak, self.active)
            try:
                await asyncio.sleep(self.delay_s)
            finally:
                self.active -= 1
            usage = {"prompt_tokens": 40, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}
            status = self.status
            if self.max_messages is not None and len(body.get("messages", ())) > self.max_messages:
                status = 400
            return Response(orjson.dumps({"choices": [], "usage": usage}), status, media_type="application/json")

        return Starlette(
            routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", lambda r: Response(""))]
        )


def cluster_of(*urls: str, policy: str = "prefix_affinity") -> ClusterState:
    pool = {"role": "interactive", "served_model": "served", "replicas": list(urls), "price": PRICE, "policy": policy}
    cfg = parse_config({"models": [{"name": "m", "pools": ["main"]}], "pools": {"main": pool}})
    return ClusterState.from_config(cfg)


def body(i: int) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": f"{SECRET_TEXT} {i}"}, {"role": "user", "content": "go"}]}


def remember(mem: PrefixMemory, keys: range, tenant: str = "t", salt: str | None = "salt-t") -> None:
    for k in keys:
        mem.record("main", tenant, k, body(k), salt, CHAT)


def comes_back(replica: ReplicaState) -> None:
    """The replica was down; a probe now says healthy."""
    replica.apply_probe(False, 1, 1)
    replica.apply_probe(True, 1, 1)


@asynccontextmanager
async def warmer(cluster: ClusterState, mem: PrefixMemory, *, meter: Any = None, tracer: Any = None,
                 **cfg: Any) -> AsyncIterator[Prewarmer]:  # fmt: skip
    w = Prewarmer(PrewarmConfig(**cfg), mem, cluster, meter=meter, tracer=tracer)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def until(cond: Any, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


@dataclass
class Rejoin:
    """A replica of `engine` that was down and probes healthy again, with its cluster and the running warmer."""

    cluster: ClusterState
    replica: ReplicaState
    w: Prewarmer


@asynccontextmanager
async def rejoining(engine: Engine, prefixes: int, *, meter: Any = None, tracer: Any = None,
                    **cfg: Any) -> AsyncIterator[Rejoin]:  # fmt: skip
    """`engine` serves a replica beside OTHER; `prefixes` are remembered; the replica comes back and is told."""
    with serve_in_thread(engine.app()) as url:
        cluster = cluster_of(url, OTHER, policy="round_robin")
        replica = cluster.pools["main"].replicas[0]
        mem = PrefixMemory(PrewarmConfig())
        remember(mem, range(prefixes))
        async with warmer(cluster, mem, meter=meter, tracer=tracer, **cfg) as w:
            comes_back(replica)
            w.on_health(replica, was_healthy=False)
            yield Rejoin(cluster, replica, w)


def test_home_of_is_the_prefix_affinity_home() -> None:
    from app.routing.prefix_affinity import PrefixAffinity

    replicas = list(cluster_of("http://a:1", "http://b:1", "http://c:1").replicas())
    for key in range(200):
        assert home_of(key * 7919, replicas) is PrefixAffinity().select(replicas, key * 7919).chosen


async def test_the_plan_is_the_joining_replicas_rendezvous_share_of_the_top_prefixes() -> None:
    cluster = cluster_of("http://a:1", "http://b:1", "http://c:1")
    old_a, old_b, new = cluster.pools["main"].replicas
    mem = PrefixMemory(PrewarmConfig(per_tenant=64))
    remember(mem, range(60))
    w = Prewarmer(PrewarmConfig(prefixes=100), mem, cluster)
    plan = w.plan(new)
    assert plan and all(home_of(p.key, [old_a, old_b, new]) is new for p in plan)
    assert len(plan) == sum(1 for k in range(60) if home_of(k, [old_a, old_b, new]) is new)
    assert len(Prewarmer(PrewarmConfig(prefixes=3), mem, cluster).plan(new)) == 3
    round_robin = cluster_of("http://a:1", "http://b:1", "http://c:1", policy="round_robin")
    rr_new = round_robin.pools["main"].replicas[2]
    assert len(Prewarmer(PrewarmConfig(prefixes=100), mem, round_robin).plan(rr_new)) == 60, "not keyed: all"


async def test_a_replica_that_comes_back_is_held_while_it_replays_then_joins() -> None:
    engine = Engine(delay_s=0.2)
    async with rejoining(engine, 3) as r:
        cluster, replica, w = r.cluster, r.replica, r.w
        other = cluster.pools["main"].replicas[1]
        assert replica.warming and not replica.available() and cluster.pools["main"].candidates() == [other]
        await until(lambda: not replica.warming)
        assert replica.available() and cluster.pools["main"].candidates() == [replica, other]
    assert len(engine.bodies) == 3
    for b in engine.bodies:
        assert b["max_tokens"] == 1 and b["stream"] is False and b["model"] == "served"
        assert b["cache_salt"] == "salt-t", "the tenant's salt: the blocks its requests look up"
    assert w.runs[-1].result == "done" and w.runs[-1].ok == 3 and w.runs[-1].prompt_tokens == 120


async def test_replays_run_at_most_concurrency_at_once() -> None:
    engine = Engine(delay_s=0.1)
    async with rejoining(engine, 10, concurrency=2) as r:
        replica = r.replica
        await until(lambda: not replica.warming)
    assert len(engine.bodies) == 10 and engine.peak == 2


async def test_a_failed_replay_ends_the_prewarm_and_the_replica_joins_cold() -> None:
    engine = Engine(status=500)
    async with rejoining(engine, 10, concurrency=1) as r:
        replica, w = r.replica, r.w
        await until(lambda: not replica.warming)
        assert replica.available()
    assert len(engine.bodies) == 1, "the first 5xx stops the replays"
    assert w.runs[-1].result == "failed"


async def test_a_rejected_prefix_is_skipped_and_the_rest_replayed() -> None:
    engine = Engine(status=400)
    async with rejoining(engine, 4) as r:
        replica, w = r.replica, r.w
        await until(lambda: not replica.warming)
    assert w.runs[-1].skipped == 4 and w.runs[-1].result == "done"


async def test_the_budget_lets_the_replica_join_with_replays_unanswered() -> None:
    engine = Engine(delay_s=30)
    async with rejoining(engine, 4, budget_s=0.3) as r:
        replica, w = r.replica, r.w
        await until(lambda: not replica.warming, within=3)
        assert replica.available() and w.runs[-1].result == "budget"


async def test_a_bad_probe_during_the_prewarm_ends_it_and_the_replica_stays_out() -> None:
    engine = Engine(delay_s=30)
    async with rejoining(engine, 4) as r:
        replica, w = r.replica, r.w
        await asyncio.sleep(0.1)
        replica.apply_probe(False, 1, 1)
        w.on_health(replica, was_healthy=True)
        await until(lambda: not replica.warming)
        assert not replica.available(), "unhealthy: it stays out until it recovers (and is warmed again)"
        assert w.runs[-1].result == "aborted"


async def test_a_replica_that_leaves_the_cluster_stops_being_warmed() -> None:
    engine = Engine(delay_s=30)
    async with rejoining(engine, 4) as r:
        replica, w = r.replica, r.w
        w.track(cluster_of("http://elsewhere:1"))
        await until(lambda: not replica.warming)
        assert w.runs[-1].result == "aborted"


async def test_a_replica_with_nothing_to_replay_joins_at_once_and_a_healthy_one_is_left_alone() -> None:
    cluster = cluster_of(f"http://127.0.0.1:{free_port()}")
    replica = cluster.pools["main"].replicas[0]
    mem = PrefixMemory(PrewarmConfig())
    async with warmer(cluster, mem) as w:
        comes_back(replica)
        w.on_health(replica, was_healthy=False)
        assert not replica.warming and replica.available()
        remember(mem, range(3))
        replica.apply_probe(True, 1, 1)
        w.on_health(replica, was_healthy=True)
        assert not replica.warming, "only a replica that just became healthy is warmed"


async def test_the_log_line_and_metrics_hold_counts_not_prompt_text(caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    caplog.set_level(logging.INFO, logger="app.prewarm.warmer")
    async with rejoining(Engine(), 2, meter=meter) as r:
        await until(lambda: not r.replica.warming)
    line = next(r.getMessage() for r in caplog.records if "prewarm" in r.getMessage())
    assert "planned=2 ok=2" in line and SECRET_TEXT not in line and "salt-t" not in line
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        m.name: sum(p.value for p in m.data.data_points if hasattr(p, "value"))
        for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }  # fmt: skip
    assert points["gateway.prewarm.requests"] == 2 and points["gateway.prewarm.runs"] == 1


def test_every_run_and_replay_series_starts_at_zero_so_a_first_pre_warm_shows_as_an_increase() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    Prewarmer(PrewarmConfig(), PrefixMemory(PrewarmConfig()), cluster_of(OTHER),
              meter=MeterProvider(metric_readers=[reader]).get_meter("t"))  # fmt: skip
    data = reader.get_metrics_data()
    assert data is not None
    series = {
        (m.name, tuple(sorted(p.attributes.items()))): p.value
        for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics for p in m.data.data_points
    }  # fmt: skip
    runs = {dict(k[1])["result"] for k in series if k[0] == "gateway.prewarm.runs"}
    assert runs == set(RUN_RESULTS) and set(series.values()) == {0}
    assert {dict(k[1])["outcome"] for k in series if k[0] == "gateway.prewarm.requests"} == set(REPLAY_OUTCOMES)


async def test_each_run_is_one_span_with_counts_and_no_text() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with rejoining(Engine(), 2, tracer=provider.get_tracer("t")) as r:
        await until(lambda: not r.replica.warming)
    (span,) = exporter.get_finished_spans()
    assert span.name == "kvgate.prewarm" and span.attributes is not None
    assert span.attributes["kvgate.prewarm.ok"] == 2 and span.attributes["kvgate.prewarm.result"] == "done"
    assert not any(SECRET_TEXT in str(v) for v in span.attributes.values())


async def test_a_pools_only_replica_or_one_beside_queueing_replicas_joins_at_once() -> None:
    cluster = cluster_of(f"http://127.0.0.1:{free_port()}", OTHER, policy="round_robin")
    replica, other = cluster.pools["main"].replicas
    mem = PrefixMemory(PrewarmConfig())
    remember(mem, range(3))
    async with warmer(cluster, mem) as w:
        other.apply_probe(False, 1, 1)  # the only other replica is down: the pool needs this one now
        comes_back(replica)
        w.on_health(replica, was_healthy=False)
        assert not replica.warming and replica.available() and w.runs[-1].result == "skipped"
        other.apply_probe(True, 1, 1)
        other.waiting, other.in_flight_at_scrape = 3, 0  # the other one queues: the pool is saturated
        comes_back(replica)
        w.on_health(replica, was_healthy=False)
        assert not replica.warming and w.runs[-1].result == "skipped"


HISTORY_TEXT = "the-session's-private-file-contents"


def session(key: int, turns: int) -> dict[str, Any]:
    """Key `key`'s session after `turns` turns: its prefix (body(key)'s), then each turn's exchange."""
    messages = body(key)["messages"]
    for t in range(turns):
        messages += [
            {"role": "assistant", "content": f"reply {t}"},
            {"role": "user", "content": f"{HISTORY_TEXT} {key}.{t}"},
        ]
    return {"messages": messages}


@asynccontextmanager
async def moving(engine: Engine, keys: range, *, tracer: Any = None, **cfg: Any) -> AsyncIterator[Rejoin]:
    """As `rejoining`, under prefix_affinity, with each key's session remembered after turn 1 and then turn 3."""
    with serve_in_thread(engine.app()) as url:
        cluster = cluster_of(url, OTHER)
        replica = cluster.pools["main"].replicas[0]
        mem = PrefixMemory(PrewarmConfig(per_tenant=64, **cfg))
        for turns in (0, 1, 3):
            for k in keys:
                mem.record("main", "t", k, session(k, turns), "salt-t", CHAT)
        async with warmer(cluster, mem, tracer=tracer, prefixes=100, **cfg) as w:
            comes_back(replica)
            w.on_health(replica, was_healthy=False)
            yield Rejoin(cluster, replica, w)


async def test_a_moved_key_replays_its_latest_history_and_a_key_that_stays_nothing() -> None:
    engine = Engine()
    async with moving(engine, range(20)) as r:
        await until(lambda: not r.replica.warming)
        peers = r.cluster.pools["main"].replicas
    moved = [k for k in range(20) if home_of(k, peers) is r.replica]
    assert 0 < len(moved) < 20
    sent = sorted(int(b["messages"][0]["content"].rsplit(" ", 1)[1]) for b in engine.bodies)
    assert sent == moved, "one replay per moved key, none for a key whose home stays"
    for b in engine.bodies:
        assert len(b["messages"]) == 8 and b["messages"][-1]["content"].endswith(".2"), "the latest: turn 3"
        assert b["max_tokens"] == 1 and b["cache_salt"] == "salt-t" and b["model"] == "served"
    assert r.w.runs[-1].histories == len(moved) and r.w.runs[-1].prompt_tokens == 40 * len(moved)


async def test_without_history_a_moved_key_replays_its_bare_prefix() -> None:
    engine = Engine()
    async with moving(engine, range(20), history_budget_chars=0) as r:
        await until(lambda: not r.replica.warming)
    assert engine.bodies and all(len(b["messages"]) == 2 for b in engine.bodies)
    assert r.w.runs[-1].histories == 0


async def test_a_history_the_engine_refuses_falls_back_to_the_bare_prefix() -> None:
    engine = Engine(max_messages=2)
    async with moving(engine, range(20)) as r:
        await until(lambda: not r.replica.warming)
    run = r.w.runs[-1]
    assert run.ok > 0 and run.skipped == 0 and run.histories == 0
    assert sum(len(b["messages"]) == 8 for b in engine.bodies) == run.ok, "each history tried first"
    assert sum(len(b["messages"]) == 2 for b in engine.bodies) == run.ok, "then its prefix"


async def test_a_run_stays_within_run_max_chars_histories_giving_way_to_their_prefixes_first() -> None:
    keys = range(10, 40)  # two digits each: every prefix and every history has the same size
    big = 10**9
    h = CHAT.warm_history(session(10, 3), big).chars  # type: ignore[union-attr]
    p = CHAT.warm_request(body(10), big).chars  # type: ignore[union-attr]
    assert h > 2 * p
    engine = Engine()
    async with moving(engine, keys, run_max_chars=h + 2 * p, concurrency=1) as r:
        await until(lambda: not r.replica.warming)
        peers = r.cluster.pools["main"].replicas
    moved = [k for k in keys if home_of(k, peers) is r.replica]
    assert len(moved) >= 4
    run = r.w.runs[-1]
    # One history, then prefixes (a second history would pass the cap) until a prefix would pass it too.
    assert (run.histories, run.ok, run.capped) == (1, 3, len(moved) - 3)
    assert [len(b["messages"]) for b in engine.bodies] == [8, 2, 2]


async def test_no_history_text_reaches_the_logs_or_the_span(caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    caplog.set_level(logging.DEBUG)
    async with moving(Engine(), range(20), tracer=provider.get_tracer("t")) as r:
        await until(lambda: not r.replica.warming)
    assert r.w.runs[-1].histories > 0
    line = next(rec.getMessage() for rec in caplog.records if "prewarm pool=" in rec.getMessage())
    assert f"histories={r.w.runs[-1].histories}" in line
    assert HISTORY_TEXT not in caplog.text and SECRET_TEXT not in caplog.text
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes["kvgate.prewarm.histories"] == r.w.runs[-1].histories
    assert not any(HISTORY_TEXT in str(v) or SECRET_TEXT in str(v) for v in span.attributes.values())
    assert not any(HISTORY_TEXT in str(e.attributes) for e in span.events)
