"""A replica that hangs (SIGSTOP: its sockets stay open, nothing comes) under streams: every stream that was on it
goes quiet for upstream.idle_timeout_s, then continues on the survivor; no stream is cut, none waits longer than
the bound (before: each waited upstream.read_timeout_s, 300 s, and was then cut)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from app.api.app import create_app
from app.config import parse_config
from tests.routing.test_faults_e2e import MODEL, SimProcess
from tests.servers import serve_in_thread

pytestmark = pytest.mark.slow

IDLE_S = 1.0
STREAMS = 6
TOKENS = 300
BOUND_S = 60.0  # well under read_timeout_s (300): what a stream on the hung replica waited before


@pytest.fixture
def hung_cluster() -> Iterator[tuple[str, SimProcess]]:
    """Gateway URL and the replica to stop (the other survives)."""
    sims = [SimProcess(), SimProcess()]
    try:
        for s in sims:
            s.start()
        cfg = parse_config({
            "models": [{"name": MODEL, "pools": ["main"]}],
            "pools": {"main": {"role": "interactive", "served_model": MODEL, "policy": "round_robin",
                               "replicas": [s.url for s in sims], "price": {"input_per_m": 1.0, "output_per_m": 2.0}}},
            "auth": {"required": False},
            "upstream": {"connect_timeout_s": 1, "read_timeout_s": 300, "idle_timeout_s": IDLE_S, "retries": 2,
                         "max_migrations": 1},
            "routing": {"probe_interval_s": 0.3},
        }, env={})  # fmt: skip
        with serve_in_thread(create_app(cfg)) as gw:
            yield gw, sims[1]
    finally:
        for s in sims:
            if s.popen is not None and s.popen.poll() is None:
                s.popen.send_signal(signal.SIGCONT)
            s.kill()


async def _stream(http: httpx.AsyncClient, gw: str, i: int, started: list[int], go: asyncio.Event) -> list[bytes]:
    body = {"model": MODEL, "stream": True, "max_tokens": TOKENS, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"stream {i}"}]}  # fmt: skip
    events: list[bytes] = []
    async with http.stream("POST", gw + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        buf = b""
        async for chunk in resp.aiter_bytes():
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if event.startswith(b"data:"):
                    if not events:
                        started[0] += 1
                        if started[0] == STREAMS:
                            go.set()
                    events.append(event[5:].strip())
    return events


async def test_streams_on_a_stopped_replica_continue_on_the_survivor_within_the_bound(
    hung_cluster: tuple[str, SimProcess],
) -> None:
    gw, victim = hung_cluster
    go, started = asyncio.Event(), [0]
    assert victim.popen is not None
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        t0 = time.monotonic()
        tasks = [asyncio.create_task(_stream(http, gw, i, started, go)) for i in range(STREAMS)]
        await asyncio.wait_for(go.wait(), 20)
        victim.popen.send_signal(signal.SIGSTOP)
        try:
            results = await asyncio.wait_for(asyncio.gather(*tasks), BOUND_S)
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
    print(f"{STREAMS} streams, one replica stopped: {cut} cut, all ended after {took:.1f} s")
    assert cut == 0
    assert 'gateway_stream_migrations_total{outcome="migrated",pool="main"}' in metrics
