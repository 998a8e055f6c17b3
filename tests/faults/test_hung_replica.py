"""A replica that hangs (SIGSTOP: its sockets stay open, nothing comes) under streams: every stream that was on it
goes quiet for upstream.idle_timeout_s, then continues on the survivor; no stream is cut, none waits longer than
the bound (before: each waited upstream.read_timeout_s, 300 s, and was then cut). Non-streaming requests it held
are retried on the survivor once its probes took it out (app/routing/hang.py)."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import orjson
import pytest

from tests.routing.test_faults_e2e import MODEL, SimProcess, cluster

__all__ = ["cluster"]  # the two-sim gateway fixture, with this test's upstream settings

pytestmark = pytest.mark.slow

IDLE_S = 1.0
STREAMS = 6
TOKENS = 300
BOUND_S = 60.0  # well under read_timeout_s (300): what a stream on the hung replica waited before


async def _stream(http: httpx.AsyncClient, gw: str, i: int, started: list[int], go: asyncio.Event) -> list[bytes]:
    body = {"model": MODEL, "stream": True, "max_tokens": TOKENS, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"stream {i}"}]}  # fmt: skip
    events: list[bytes] = []
    async with http.stream("POST", gw + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            if not events:
                started[0] += 1
                if started[0] == STREAMS:
                    go.set()
            events.append(line[5:].strip().encode())
    return events


async def _whole(http: httpx.AsyncClient, gw: str, i: int) -> int:
    body = {"model": MODEL, "max_tokens": TOKENS, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"whole {i}"}]}  # fmt: skip
    r = await http.post(gw + "/v1/chat/completions", json=body)
    return r.status_code if r.status_code != 200 else r.json()["usage"]["completion_tokens"]


# Probes every 0.3 s (1 s timeout, 2 misses): the stopped replica is out of rotation about 2.5 s after SIGSTOP.
@pytest.mark.parametrize("cluster", [{"read_timeout_s": 300, "idle_timeout_s": IDLE_S}], indirect=True)
async def test_streams_on_a_stopped_replica_continue_on_the_survivor_within_the_bound(
    cluster: tuple[str, SimProcess, SimProcess],
) -> None:
    gw, _, victim = cluster
    go, started = asyncio.Event(), [0]
    assert victim.popen is not None
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        t0 = time.monotonic()
        tasks = [asyncio.create_task(_stream(http, gw, i, started, go)) for i in range(STREAMS)]
        await asyncio.wait_for(go.wait(), 20)
        wholes = [asyncio.create_task(_whole(http, gw, i)) for i in range(STREAMS)]  # half of them on the victim
        await asyncio.sleep(0.2)
        victim.popen.send_signal(signal.SIGSTOP)
        try:
            results = await asyncio.wait_for(asyncio.gather(*tasks), BOUND_S)
            answered = await asyncio.wait_for(asyncio.gather(*wholes), BOUND_S)
        finally:
            victim.popen.send_signal(signal.SIGCONT)
        took = time.monotonic() - t0
        metrics = (await http.get(gw + "/metrics")).text
    cut = 0
    for events in results:
        docs = [orjson.loads(e) for e in events[:-1]]
        finishes = [c["finish_reason"] for d in docs for c in d.get("choices", []) if c.get("finish_reason")]
        whole = events[-1] == b"[DONE]" and all("error" not in d for d in docs) and finishes == ["length"]
        cut += not whole
    print(f"{STREAMS} streams and {STREAMS} whole requests, one replica stopped: {cut} cut, all ended after "
          f"{took:.1f} s; whole requests answered {answered}")
    assert cut == 0
    assert answered == [TOKENS] * STREAMS  # the ones on the stopped replica were retried, not held 300 s
    assert 'gateway_stream_migrations_total{outcome="migrated",pool="main"}' in metrics
