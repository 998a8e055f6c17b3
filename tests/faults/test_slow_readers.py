"""A client that never reads its stream is cut within listen.write_timeout_s: the connection closed, the upstream
request aborted (the sim stops running it), the tenant's concurrency slot free again; counted as a write timeout."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import orjson

from app.api.app import create_app
from app.api.server import server_config
from tests.faults.helpers import VICTIM, chat, poisonable_sims, two_tenants
from tests.servers import free_port, running

WRITE_TIMEOUT_S = 1.0
BOUND_S = 30.0  # an upper bound for a loaded machine, not a measurement


def stream_request(port: int, tokens: int) -> bytes:
    body = orjson.dumps(chat("tell me everything", max_tokens=tokens, stream=True, ignore_eos=True))
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + VICTIM.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body)


def running_requests(sim: str) -> float:
    text = httpx.get(sim + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


async def wait_for(check: object, bound_s: float) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):  # type: ignore[arg-type]
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_client_that_never_reads_is_cut_and_its_upstream_and_slot_freed() -> None:
    with poisonable_sims(1, time_scale=50, max_model_len=200_000) as sims:
        port = free_port()
        tenants = [{"id": "victim", "api_keys": [VICTIM], "limits": {"concurrent": 1}}]
        cfg = two_tenants(sims, tenants=tenants, listen={"host": "127.0.0.1", "port": port,
                                                         "write_timeout_s": WRITE_TIMEOUT_S})
        app = create_app(cfg)
        config = server_config(app, cfg.listen, app.connections, loop="asyncio", log_level="error")
        with running(config) as gw:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(stream_request(port, 100_000))  # and never read
            t0 = time.monotonic()
            try:
                assert await wait_for(lambda: running_requests(sims[0]) >= 1, BOUND_S)
                assert await wait_for(lambda: running_requests(sims[0]) == 0, BOUND_S)  # the upstream was aborted
                print(f"never-reading client: upstream request aborted {time.monotonic() - t0:.1f} s after it was "
                      f"sent (write_timeout_s {WRITE_TIMEOUT_S:g})")
                async with httpx.AsyncClient(base_url=gw, timeout=30) as http:
                    metrics = (await http.get("/metrics")).text
                    assert 'gateway_connections_timed_out_total{phase="write"} 1' in metrics
                    # The slot is free: one more request of the tenant (concurrent: 1) is served.
                    r = await http.post("/v1/chat/completions", json=chat("again"),
                                        headers={"authorization": f"Bearer {VICTIM}"})
                    assert r.status_code == 200
            finally:
                sock.close()
