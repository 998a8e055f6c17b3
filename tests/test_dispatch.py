"""The dispatcher without sockets: failover and backoff, lease accounting, breaker verdicts, the stream relay."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from app.call_estimate import CallEstimate
from app.context import ClassDecision, RequestContext
from app.dispatch import Complete, Dispatcher, StreamRelay
from app.errors import GatewayError, upstream_status, upstream_timeout, upstream_unreachable
from app.routing.lease import Lease
from app.routing.state import ClusterState, ReplicaState
from app.surfaces import CHAT
from tests.routing.factory import make_config

A, B = "http://127.0.0.1:9101", "http://127.0.0.1:9102"
OK_BODY = (
    b'{"id":"c1","model":"m","choices":[{"finish_reason":"stop","text":"hi"}],'
    b'"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":2}}}'
)
CHUNKS = [
    b'data: {"id":"c1","model":"m","choices":[{"delta":{"content":"h"}}]}\n\n',
    b'data: {"id":"c1","model":"m","choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'
    b'data: {"id":"c1","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n',
    b"data: [DONE]\n\n",
]


class FakeResponse:
    """An upstream response whose head arrived; body and chunks scripted, closes counted."""

    def __init__(self, status: int = 200, body: bytes = OK_BODY, chunks: list[bytes] | None = None,
                 fail_after: int | None = None, load_report: str | None = None) -> None:  # fmt: skip
        self.status = status
        self.content_type = "text/event-stream; charset=utf-8" if chunks is not None else "application/json"
        self.load_report = load_report
        self._body = body
        self._chunks = chunks or []
        self._fail_after = fail_after
        self.closed = self.released = 0

    async def body(self) -> bytes:
        if self._fail_after is not None:
            raise upstream_timeout("upstream timed out")
        return self._body

    async def chunks(self) -> AsyncIterator[bytes]:
        for i, chunk in enumerate(self._chunks):
            if self._fail_after is not None and i >= self._fail_after:
                raise upstream_unreachable("connection reset", "protocol")
            yield chunk

    def close(self) -> None:
        self.closed += 1

    def release(self) -> None:
        self.released += 1


class FakeTransport:
    """Answers per replica from a script: an exception to raise or a response to return."""

    def __init__(self, script: dict[str, list[Any]]) -> None:
        self.script = script
        self.sent: list[str] = []
        self.headers: list[Mapping[str, str]] = []

    async def send(self, replica: str, path: str, payload: bytes, headers: Mapping[str, str], **_: Any) -> Any:
        self.sent.append(replica)
        self.headers.append(dict(headers))
        outcome = self.script[replica].pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def ctx(stream: bool = False) -> RequestContext:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    c = RequestContext(request_id="r1", surface=CHAT, path="/v1/chat/completions", body=body, model="m",
                       stream=stream, client_wants_usage=False, headers={}, prompt=CHAT.view(body))  # fmt: skip
    c.route_class = ClassDecision("interactive", "default")
    return c


def setup(
    script: dict[str, list[Any]], upstream: dict[str, Any] | None = None, **routing: Any
) -> tuple[Dispatcher, ClusterState, list[float]]:
    cfg = make_config([A, B], [], fast_extra={"policy": "round_robin"}, routing=routing)
    if upstream:
        cfg = cfg.model_copy(update={"upstream": cfg.upstream.model_copy(update=upstream)})
    cluster = ClusterState.from_config(cfg)
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    return Dispatcher(cfg, cluster, FakeTransport(script), sleep=sleep), cluster, sleeps


def replica(cluster: ClusterState, url: str) -> ReplicaState:
    return next(r for r in cluster.replicas() if r.url == url)


def key() -> int:
    return 0


async def test_connect_failure_fails_over_to_the_next_replica_after_a_backoff() -> None:
    d, cluster, sleeps = setup({A: [upstream_unreachable("refused")], B: [FakeResponse()]})
    c = ctx()
    out = await d.run(c, d.cfg.models[0], key())
    assert isinstance(out, Complete) and out.status == 200
    assert c.route is not None and c.route.replica == B and c.route.attempt == 2 and c.route.reason == "failover"
    assert len(sleeps) == 1 and 0 <= sleeps[0] <= d.cfg.upstream.backoff.base_s
    a, b = replica(cluster, A), replica(cluster, B)
    assert (a.in_flight, b.in_flight) == (0, 0)
    assert a.last_error == "connect" and a.breaker._consecutive == 1
    assert b.breaker._consecutive == 0
    assert c.usage.prompt_tokens == 5 and c.usage.cached_tokens == 2 and c.finish_reasons == ["stop"]


async def test_a_5xx_counts_against_the_replica_as_status_5xx_and_is_retried() -> None:
    d, cluster, _ = setup({A: [upstream_status(A, 503)], B: [FakeResponse()]})
    out = await d.run(ctx(), d.cfg.models[0], key())
    assert isinstance(out, Complete)
    assert replica(cluster, A).last_error == "status_5xx"


async def test_when_every_attempt_fails_the_last_error_is_raised_and_no_lease_leaks() -> None:
    d, cluster, sleeps = setup({A: [upstream_timeout("t")], B: [upstream_unreachable("r")]}, allow_spill=False)
    with pytest.raises(GatewayError) as info:
        await d.run(ctx(), d.cfg.models[0], key())
    assert info.value.code == "upstream_unreachable"
    assert all(r.in_flight == 0 for r in cluster.replicas())
    assert replica(cluster, A).last_error == "timeout"
    assert len(sleeps) == 2  # a backoff after each failed attempt while retries remain; then no replica is left


async def test_a_body_that_breaks_off_is_a_failure_and_not_retried() -> None:
    d, cluster, _ = setup({A: [FakeResponse(fail_after=0)], B: [FakeResponse()]})
    with pytest.raises(GatewayError):
        await d.run(ctx(), d.cfg.models[0], key())
    a = replica(cluster, A)
    assert a.in_flight == 0 and a.last_error == "timeout"


async def test_cancellation_while_waiting_releases_the_lease_without_a_verdict() -> None:
    import asyncio

    d, cluster, _ = setup({A: [asyncio.CancelledError()]})
    with pytest.raises(asyncio.CancelledError):
        await d.run(ctx(), d.cfg.models[0], key())
    a = replica(cluster, A)
    assert a.in_flight == 0 and a.last_error is None and a.breaker._consecutive == 0


async def test_upstream_4xx_is_the_clients_fault_and_keeps_the_replica_healthy() -> None:
    d, cluster, _ = setup({A: [FakeResponse(status=400, body=b'{"error":{}}')]})
    out = await d.run(ctx(), d.cfg.models[0], key())
    assert isinstance(out, Complete) and out.status == 400
    assert replica(cluster, A).breaker._consecutive == 0


async def test_repeated_failures_open_the_breaker_and_take_the_replica_out_of_rotation() -> None:
    failures = 3
    d, cluster, _ = setup({A: [upstream_unreachable("r")] * failures, B: [upstream_unreachable("r")] * failures},
                          breaker={"failures": failures})  # fmt: skip
    for _ in range(failures):
        with pytest.raises(GatewayError):
            await d.run(ctx(), d.cfg.models[0], key())
    assert all(r.breaker.state == "open" and not r.available() for r in cluster.replicas())
    with pytest.raises(GatewayError) as info:
        await d.run(ctx(), d.cfg.models[0], key())
    assert info.value.code == "no_healthy_upstream"


async def collect(relay: StreamRelay) -> bytes:
    return b"".join([chunk async for chunk in relay.events()])


async def test_a_clean_stream_drops_the_unrequested_usage_chunk_and_succeeds() -> None:
    resp = FakeResponse(chunks=CHUNKS)
    d, cluster, _ = setup({A: [resp]})
    c = ctx(stream=True)
    relay = await d.run(c, d.cfg.models[0], key())
    assert isinstance(relay, StreamRelay)
    assert replica(cluster, A).in_flight == 1  # the lease lives as long as the stream
    out = await collect(relay)
    assert b'"usage"' not in out and b"[DONE]" not in out  # [DONE] follows the trailer (ending())
    assert c.usage.prompt_tokens == 5 and c.finish_reasons == ["stop"]
    a = replica(cluster, A)
    assert a.in_flight == 0 and a.breaker._consecutive == 0 and resp.released == 1


async def test_a_stream_cut_midway_ends_with_an_error_event_and_counts_against_the_replica() -> None:
    resp = FakeResponse(chunks=CHUNKS, fail_after=1)
    d, cluster, _ = setup({A: [resp]}, upstream={"max_migrations": 0})
    c = ctx(stream=True)
    relay = await d.run(c, d.cfg.models[0], key())
    assert isinstance(relay, StreamRelay)
    out = await collect(relay)
    assert out.endswith(b'"code":"upstream_unreachable"}}\n\n') and b'"content":"h"' in out
    a = replica(cluster, A)
    assert a.in_flight == 0 and a.last_error == "protocol" and resp.closed == 1


async def test_a_stream_without_its_final_event_is_a_protocol_failure() -> None:
    resp = FakeResponse(chunks=CHUNKS[:2])
    d, cluster, _ = setup({A: [resp]})
    relay = await d.run(ctx(stream=True), d.cfg.models[0], key())
    assert isinstance(relay, StreamRelay)
    out = await collect(relay)
    assert b"before its final event" in out
    assert replica(cluster, A).last_error == "protocol"


async def test_a_client_that_leaves_mid_stream_releases_the_lease_without_a_verdict() -> None:
    resp = FakeResponse(chunks=CHUNKS)
    d, cluster, _ = setup({A: [resp]})
    c = ctx(stream=True)
    relay = await d.run(c, d.cfg.models[0], key())
    assert isinstance(relay, StreamRelay)
    events = relay.events()
    await events.__anext__()
    await events.aclose()
    a = replica(cluster, A)
    assert a.in_flight == 0 and a.breaker._consecutive == 0 and a.last_error is None
    assert resp.closed == 1 and c.error_type == "client_disconnected"


def test_a_lease_ends_exactly_once_whatever_is_called_after_the_verdict() -> None:
    r = ReplicaState(A)
    with Lease(r) as lease:
        assert r.in_flight == 1
        lease.fail("connect")
        lease.succeed()
    assert r.in_flight == 0 and r.breaker._consecutive == 1


async def test_a_body_nested_deeper_than_the_writer_allows_is_a_400_not_a_500() -> None:
    d, _, _ = setup({A: [FakeResponse()]})
    c = ctx()
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    c.body["metadata"] = deep
    with pytest.raises(GatewayError) as info:
        await d.run(c, d.cfg.models[0], key())
    assert info.value.status == 400 and not c.upstream_called


async def test_a_chat_request_asks_for_the_load_report_and_its_reply_refreshes_the_replicas_load() -> None:
    report = "TEXT named_metrics.num_requests_waiting=4.0, named_metrics.kv_cache_usage_perc=0.75"
    d, cluster, _ = setup({A: [FakeResponse(load_report=report)]})
    await d.run(ctx(), d.cfg.models[0], key())
    assert isinstance(d.transport, FakeTransport)
    assert d.transport.headers[0]["endpoint-load-metrics-format"] == "TEXT"
    a = replica(cluster, A)
    assert (a.waiting, a.kv_usage, a.load_reports) == (4, 0.75, 1)
    assert a.queued() == 4 and a.load_report_at > 0


async def test_an_unparsable_load_report_is_counted_and_leaves_the_load_alone() -> None:
    d, cluster, _ = setup({A: [FakeResponse(load_report="TEXT waiting=lots")]})
    await d.run(ctx(), d.cfg.models[0], key())
    a = replica(cluster, A)
    assert (a.load_reports, a.load_reports_unparsable, a.waiting) == (0, 1, 0)


async def test_a_pool_with_load_report_off_does_not_ask() -> None:
    cfg = make_config([A, B], [], fast_extra={"policy": "round_robin", "load_report": {"enabled": False}})
    transport = FakeTransport({A: [FakeResponse()]})
    d = Dispatcher(cfg, ClusterState.from_config(cfg), transport)
    await d.run(ctx(), cfg.models[0], key())
    assert "endpoint-load-metrics-format" not in transport.headers[0]


async def test_a_surface_vllm_does_not_report_load_on_is_not_asked() -> None:
    d, _, _ = setup({A: [FakeResponse()]})
    c = ctx()
    c.path = "/v1/responses"
    await d.run(c, d.cfg.models[0], key())
    assert isinstance(d.transport, FakeTransport)
    assert "endpoint-load-metrics-format" not in d.transport.headers[0]


async def test_the_pick_hook_runs_once_per_attempt_with_the_route_already_set() -> None:
    seen: list[str | None] = []
    cfg = make_config([A, B], [], fast_extra={"policy": "round_robin"})
    transport = FakeTransport({A: [upstream_unreachable("refused")], B: [FakeResponse()]})

    async def no_sleep(_: float) -> None:
        return None

    d = Dispatcher(cfg, ClusterState.from_config(cfg), transport, sleep=no_sleep,
                   on_pick=lambda c: seen.append(c.route.replica if c.route else None))  # fmt: skip
    await d.run(ctx(), cfg.models[0], key())
    assert seen == [A, B]


async def test_a_cut_stream_bills_the_post_pick_estimate_with_its_cached_tokens() -> None:
    resp = FakeResponse(chunks=CHUNKS, fail_after=1)
    d, _, _ = setup({A: [resp]}, upstream={"max_migrations": 0})
    c = ctx(stream=True)
    c.call_estimate = CallEstimate(prompt_tokens=1100, cached_tokens=1024, output_tokens=64, exact=True)
    relay = await d.run(c, d.cfg.models[0], key())
    assert isinstance(relay, StreamRelay)
    await collect(relay)
    assert (c.usage.prompt_tokens, c.usage.cached_tokens, c.usage.completion_tokens) == (1100, 1024, 1)
    assert c.usage_estimated
