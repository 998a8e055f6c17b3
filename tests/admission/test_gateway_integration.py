"""The admission queue through the gateway, in front of a real sim: a saturated pool queues, refuses with 429 +
Retry-After, lets a waiter in when a slot frees, and every path (complete, stream, error, client gone, waiting
client gone) gives its slot back exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.admission import AdmissionQueue
from app.api.app import create_app
from app.gateway import Gateway
from app.sim.testing import running_sim
from tests.conftest import PUBLIC_MODEL, gateway_config
from tests.servers import serve_in_thread

# ~7 ms per output token on h100-8b: a request of LONG tokens holds the sim's only slot for about a second.
LONG = 150
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@contextmanager
def gateway_on_sim(admission: dict[str, Any], **sim: Any) -> Iterator[tuple[str, Gateway]]:
    """A gateway whose one pool (one sim, one engine slot by default) has `admission`; yields URL and Gateway."""
    with running_sim(model="served-model", **{"max_num_seqs": 1, **sim}) as url:
        cfg = gateway_config(
            [url],
            pools={"main": {
                "role": "interactive", "served_model": "served-model", "replicas": [url], "policy": "round_robin",
                "price": {"input_per_m": 1.0, "cached_input_per_m": 0.1, "output_per_m": 2.0},
                # A queued request here waits out two ~1 s requests: the 2 s interactive deadline would refuse it
                # on a loaded machine; the deadline test sets its own.
                "admission": {"enabled": True, "max_waiting_per_replica": 1,
                              "deadline_s": {"interactive": 30, "bulk": 30}, **admission},
            }},
            upstream={"connect_timeout_s": 1, "read_timeout_s": 30, "max_body_bytes": 65536, "retries": 0},
            routing={"probe_interval_s": 0.05, "healthy_after": 1, "unhealthy_after": 3},
        )
        app = create_app(cfg)
        with serve_in_thread(app) as gw:
            yield gw, app.api.state.gateway


def client(base: str, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="EMPTY", max_retries=0, timeout=timeout)


def long_request(base: str, results: list[Any], tokens: int = LONG, **kw: Any) -> threading.Thread:
    """Start a request in a thread; its reply (or exception) lands in `results`."""

    def run() -> None:
        try:
            results.append(client(base).chat.completions.with_raw_response.create(
                model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=tokens, extra_body={"ignore_eos": True}, **kw,
            ))
        except Exception as e:  # kept for the assertion
            results.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def saturate(base: str, queue: AdmissionQueue, results: list[Any]) -> list[threading.Thread]:
    """One request running in the sim and one waiting in its engine queue: the next scrape caps the pool."""
    threads = [long_request(base, results)]
    # Running, as a scrape saw it: a scrape that caught it between the sim's steps (waiting, nothing running)
    # would cap the pool with one in flight and keep the second in the gateway, not in the engine.
    wait_for(lambda: queue.in_flight == 1 and queue.saturation.running == 1 and queue.limit is None)
    threads.append(long_request(base, results))
    wait_for(lambda: queue.limit is not None and queue.saturation.saturated)
    return threads


def idle(queue: AdmissionQueue) -> bool:
    return queue.in_flight == 0 and queue.in_flight_tokens == 0 and queue.queue_len == 0 and not queue.tenant_in_flight


def test_below_saturation_requests_pass_without_waiting_and_say_nothing_of_a_queue() -> None:
    with gateway_on_sim({}) as (base, gw):
        queue = gw.queues["main"]
        raw = client(base).chat.completions.with_raw_response.create(model=PUBLIC_MODEL, messages=MESSAGES,
                                                                     max_tokens=4)
        assert raw.http_response.status_code == 200
        assert "queued=" not in raw.headers["x-kvgate-route"]
        assert idle(queue) and not queue.waits


def test_a_request_that_cannot_start_within_its_deadline_gets_429_with_retry_after() -> None:
    with gateway_on_sim({"deadline_s": {"interactive": 0.2, "bulk": 0.2}}) as (base, gw):
        queue = gw.queues["main"]
        results: list[Any] = []
        threads = saturate(base, queue, results)
        r = httpx.post(f"{base}/v1/chat/completions", json={"model": PUBLIC_MODEL, "messages": MESSAGES,
                                                             "max_tokens": 4}, timeout=10)
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert r.headers["x-kvgate-limit"] == "rejected:queue"
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert queue.rejected == {("anonymous", "deadline"): 1}
        for t in threads:
            t.join(20)
        assert all(x.http_response.status_code == 200 for x in results)
        wait_for(lambda: idle(queue))
        metrics = httpx.get(f"{base}/metrics").text
        assert 'gateway_rate_limited_total{action="reject",limit="queue",tenant="anonymous"' in metrics


def test_a_full_queue_refuses_the_newest_request_of_the_same_tenant_with_429() -> None:
    with gateway_on_sim({"max_queue_len": 1}) as (base, gw):
        queue = gw.queues["main"]
        results: list[Any] = []
        threads = saturate(base, queue, results)
        threads.append(long_request(base, results, tokens=4))  # waits in the gateway: the queue is now full
        wait_for(lambda: queue.queue_len == 1)
        with pytest.raises(openai.RateLimitError) as err:
            client(base).chat.completions.create(model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=4)
        assert err.value.response.headers["x-kvgate-limit"] == "rejected:queue"
        assert int(err.value.response.headers["retry-after"]) >= 1
        for t in threads:
            t.join(20)
        assert [x.http_response.status_code for x in results] == [200, 200, 200], (results, queue.rejected)
        wait_for(lambda: idle(queue))


def test_a_queued_request_proceeds_when_a_slot_frees_and_reports_its_wait() -> None:
    with gateway_on_sim({}) as (base, gw):
        queue = gw.queues["main"]
        results: list[Any] = []
        threads = saturate(base, queue, results)
        threads.append(long_request(base, results, tokens=4))
        wait_for(lambda: queue.queue_len == 1)
        for t in threads:
            t.join(20)
        assert all(x.http_response.status_code == 200 for x in results)
        queued = results[-1]
        route = queued.headers["x-kvgate-route"]
        assert ";queued=" in route
        assert int(route.rsplit(";queued=", 1)[1].split(";")[0]) > 100  # it waited for a running request
        wait_for(lambda: idle(queue))
        assert queue.waits["anonymous"].count == 1
        metrics = httpx.get(f"{base}/metrics").text
        assert 'gateway_queue_wait_seconds_count{class="interactive",pool="main",tenant="anonymous"} 3' in metrics
        assert 'gateway_queue_tokens_total{pool="main",tenant="anonymous"}' in metrics
        assert 'gateway_queue_length{pool="main",tenant="anonymous"} 0' in metrics
        assert 'gateway_queue_in_flight{pool="main"} 0' in metrics


def test_a_client_that_leaves_while_queued_leaves_nothing_behind() -> None:
    with gateway_on_sim({}) as (base, gw):
        queue = gw.queues["main"]
        results: list[Any] = []
        threads = saturate(base, queue, results)
        with pytest.raises(openai.APITimeoutError):
            client(base, timeout=0.3).chat.completions.create(model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=4)
        wait_for(lambda: queue.queue_len == 0)
        for t in threads:
            t.join(20)
        assert all(x.http_response.status_code == 200 for x in results)
        wait_for(lambda: idle(queue))
        assert "anonymous" not in queue.waits  # never granted, never charged a wait
        # Only the two requests that ran were charged.
        assert queue.served_tokens["anonymous"] == pytest.approx(sum(
            x.parse().usage.prompt_tokens - (x.parse().usage.prompt_tokens_details.cached_tokens or 0)
            + x.parse().usage.completion_tokens for x in results
        ))


def test_every_path_releases_its_slot_exactly_once() -> None:
    with gateway_on_sim({}, max_num_seqs=4) as (base, gw):
        queue = gw.queues["main"]
        c = client(base)
        # complete
        c.chat.completions.create(model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=4)
        assert idle(queue)
        # stream to its end
        chunks = list(c.chat.completions.create(model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=8, stream=True))
        assert chunks
        wait_for(lambda: idle(queue))
        # an upstream error (the sim refuses the body)
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=4, temperature=-5)
        wait_for(lambda: idle(queue))
        # the client leaves mid-stream
        with httpx.stream("POST", f"{base}/v1/chat/completions", json={
            "model": PUBLIC_MODEL, "messages": MESSAGES, "max_tokens": LONG, "stream": True, "ignore_eos": True,
        }, timeout=10) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for _ in range(6):  # keep reading: a client that stops reading is soon taken for gone
                next(lines)
            assert queue.in_flight == 1
        wait_for(lambda: idle(queue))
        # a request refused before any upstream call (unknown model) never took a slot
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="nope", messages=MESSAGES, max_tokens=4)
        assert idle(queue)
        # One charge per request that ran, none negative: released once each (a second release would have
        # driven in_flight below zero, which idle() rules out).
        assert len(queue.served_tokens) == 1 and queue.served_tokens["anonymous"] > 0


def test_degrade_serves_a_refused_interactive_request_as_bulk_on_the_bulk_pool() -> None:
    with running_sim(model="served-model", max_num_seqs=1) as fast, running_sim(model="served-model") as bulk:
        price = {"input_per_m": 1.0, "cached_input_per_m": 0.1, "output_per_m": 2.0}
        cfg = gateway_config(
            [fast],
            models=[{"name": PUBLIC_MODEL, "pools": ["fast", "bulk"]}],
            pools={
                "fast": {"role": "interactive", "served_model": "served-model", "replicas": [fast], "price": price,
                         "admission": {"enabled": True, "max_waiting_per_replica": 1, "on_exceed": "degrade",
                                       "deadline_s": {"interactive": 0.1, "bulk": 5}}},
                "bulk": {"role": "bulk", "served_model": "served-model", "replicas": [bulk], "price": price},
            },
            upstream={"connect_timeout_s": 1, "read_timeout_s": 30, "max_body_bytes": 65536, "retries": 0},
            routing={"probe_interval_s": 0.05, "healthy_after": 1, "unhealthy_after": 3,
                     "spill": {"waiting_threshold": 1000}, "bulk_borrow_below_utilization": 0.0},
        )
        app = create_app(cfg)
        with serve_in_thread(app) as base:
            queue = app.api.state.gateway.queues["fast"]
            results: list[Any] = []
            threads = saturate(base, queue, results)
            raw = client(base).chat.completions.with_raw_response.create(
                model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=4, extra_headers={"x-kvgate-class": "interactive"}
            )
            assert raw.http_response.status_code == 200
            assert raw.headers["x-kvgate-route"].startswith("pool=bulk;class=bulk;reason=degraded")
            assert "degraded:queue" in raw.headers["x-kvgate-limit"]
            for t in threads:
                t.join(20)
            wait_for(lambda: idle(queue))


def test_a_stream_tells_its_ticket_of_the_first_token_once_while_it_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.queue_ticket import Ticket

    calls: list[bool] = []
    real = Ticket.first_token
    monkeypatch.setattr(Ticket, "first_token", lambda self: (calls.append(self._released), real(self))[1])
    with gateway_on_sim({}, max_num_seqs=4) as (base, gw):
        queue = gw.queues["main"]
        client(base).chat.completions.create(model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=4)
        assert calls == []  # not a stream: nothing watched (its release ends it)
        with httpx.stream("POST", f"{base}/v1/chat/completions", json={
            "model": PUBLIC_MODEL, "messages": MESSAGES, "max_tokens": LONG, "stream": True, "ignore_eos": True,
        }, timeout=10) as r:
            lines = r.iter_lines()
            for _ in range(6):
                next(lines)
            assert calls == [False] and queue.in_flight == 1  # told at the first token, the slot still held
            for _ in lines:
                pass
        wait_for(lambda: idle(queue))
        assert calls == [False]
