"""A short soak of mixed hostile bursts (experiments/burst_soak.py in CI's size): nothing leaks and nothing spills
onto others. Each burst at once: small chat requests of the victim tenant (under its `concurrent` limit: a 429 is
that limit), poisoned requests of the attacker (count_tokens asking for a stream, bodies every sim fails), and of
a third tenant streams dropped after a few lines, Messages streams read whole and streams whose client never reads.
Afterwards every replica runs 0 requests, `concurrent` victim requests at once are all admitted (no leaked lease)
and /ready is 200."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest

from app.api.app import create_app
from app.api.server import server_config
from kvlab.net import never_reader, wait_http
from kvlab.procs import KVGATE, start_logged, stop_all
from tests.faults.helpers import ATTACKER, MARKER, TENANTS, VICTIM, chat, messages, poisoned, two_tenants
from tests.faults.test_slow_readers import running_requests, wait_for
from tests.servers import free_port, running

pytestmark = pytest.mark.slow

BURSTS = 3
CONCURRENT = 20
STREAMER = "sk-streamer"


@contextmanager
def sim_processes(n: int) -> Iterator[list[str]]:
    """`n` `kvgate sim` processes that fail a MARKER body: in-thread sims share the test's GIL with the gateway
    and the clients, and starved, they miss probes and get taken out (then the soak measures the harness)."""
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for _ in range(n):
            port = free_port()
            procs.append(start_logged([*KVGATE, "sim", "--port", str(port), "--model", "served-model",
                                       "--time-scale", "50", "--max-model-len", "200000", "--fail-marker", MARKER,
                                       "--log-level", "warning"], None))
            urls.append(f"http://127.0.0.1:{port}")
            wait_http(urls[-1] + "/health", 30, procs[-1])
        yield urls
    finally:
        stop_all(procs)


def held_stream(port: int, i: int) -> socket.socket:
    """The third tenant's stream whose client never reads."""
    body = orjson.dumps(chat(f"hold {i}", max_tokens=100_000, stream=True, ignore_eos=True))
    return never_reader(port, STREAMER, body)


async def burst(http: httpx.AsyncClient, port: int, b: int, out: dict[str, Counter[int | str]],
                held: list[socket.socket]) -> None:
    streamer = {"authorization": f"Bearer {STREAMER}"}

    async def status(kind: str, aw: Any) -> None:
        try:
            out[kind][await aw] += 1
        except httpx.HTTPError as err:
            out[kind][f"{type(err).__name__}: {err}"] += 1

    async def post(path: str, body: dict[str, Any], key: str) -> int:
        r = await http.post(path, json=body, headers={"authorization": f"Bearer {key}"})
        if r.status_code >= 502:  # kept for the failure's message: which condition it was
            out["gateway 5xx"][f"{r.status_code} {r.text[:200]}"] += 1
        return r.status_code

    async def dropped(i: int) -> int:
        body = chat(f"drop {i}", max_tokens=400, stream=True, ignore_eos=True)
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=streamer) as r:
            n = 0
            async for _ in r.aiter_lines():
                n += 1
                if n >= 10:
                    break
            return r.status_code

    async def whole_messages(i: int) -> int:
        async with http.stream("POST", "/v1/messages", json=messages(f"m {i}", 32, stream=True),
                               headers=streamer) as r:
            lines = [line async for line in r.aiter_lines()]
        return r.status_code if r.status_code != 200 or "event: message_stop" in lines else -1

    work = [status("victim", post("/v1/chat/completions", chat(f"b{b} r{i}"), VICTIM)) for i in range(30)]
    work += [status("attacker", post(*poisoned(b * 12 + i), ATTACKER)) for i in range(12)]
    work += [status("dropped", dropped(b * 8 + i)) for i in range(8)]
    work += [status("messages", whole_messages(b * 6 + i)) for i in range(6)]
    held.extend(held_stream(port, b * 3 + i) for i in range(3))
    await asyncio.gather(*work)


async def test_mixed_hostile_bursts_leak_no_slot_request_or_breaker_and_spare_the_victim() -> None:
    tenants = [*TENANTS[:1], {"id": "victim", "api_keys": [VICTIM], "limits": {"concurrent": CONCURRENT}},
               {"id": "streamer", "api_keys": [STREAMER]}]
    with sim_processes(2) as sims:
        port = free_port()
        cfg = two_tenants(sims, tenants=tenants, upstream={"connect_timeout_s": 1, "read_timeout_s": 30,
                                                           "idle_timeout_s": 5, "retries": 2},
                          # Gateway and clients share this process's GIL: a write deadline the test's own
                          # (busy) readers always meet.
                          listen={"host": "127.0.0.1", "port": port, "write_timeout_s": 3,
                                  "max_connections_per_client": 1024})
        app = create_app(cfg)
        config = server_config(app, cfg.listen, app.connections, loop="asyncio", log_level="error")
        out: dict[str, Counter[int | str]] = {k: Counter() for k in ("victim", "attacker", "dropped", "messages",
                                                                      "gateway 5xx")}
        held: list[socket.socket] = []
        with running(config) as gw:
            # Keep-alive shorter than the gateway's (5 s): no request on a socket it is closing.
            limits = httpx.Limits(max_connections=200, keepalive_expiry=2)
            async with httpx.AsyncClient(base_url=gw, timeout=60, limits=limits) as http:
                t0 = time.monotonic()
                try:
                    for b in range(BURSTS):
                        await burst(http, port, b, out, held)
                    # The never-readers are cut by the write deadline while they are still held open.
                    assert await wait_for(lambda: all(running_requests(s) == 0 for s in sims), 30)
                finally:
                    for s in held:
                        s.close()
                took = time.monotonic() - t0
                victim = {"authorization": f"Bearer {VICTIM}"}
                final = await asyncio.gather(*(http.post("/v1/chat/completions", json=chat(f"after {i}"),
                                                         headers=victim) for i in range(CONCURRENT)))
                ready = (await http.get("/ready")).status_code
                metrics = (await http.get("/metrics")).text
    cut = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith("gateway_connections_timed_out_total") and 'phase="write"' in line)
    print(f"{BURSTS} bursts in {took:.1f} s: {({k: dict(v) for k, v in out.items()})}; write timeouts {cut:g}")
    v = out["victim"]
    assert not out["gateway 5xx"], out
    assert set(v) <= {200, 429} and v[200] >= CONCURRENT * BURSTS  # only its own limit ever refused it
    assert set(out["attacker"]) <= {200, 429, 500}
    assert out["dropped"] == {200: 8 * BURSTS} and out["messages"] == {200: 6 * BURSTS}
    assert [r.status_code for r in final] == [200] * CONCURRENT  # no lease leaked
    assert ready == 200
    assert cut == 3 * BURSTS  # every never-reader cut by the write deadline
