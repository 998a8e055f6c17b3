"""A replica process is SIGKILLed under load and restarted: failover, stream error events, rejoin.

Two `kvgate sim` processes (real processes, so kill -9 is a real crash) behind the gateway app; round robin so
both replicas get traffic deterministically.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from app.api.app import create_app
from app.config import parse_config
from kvlab.net import wait_http
from kvlab.procs import KVGATE, start_logged
from tests.servers import free_port, serve_in_thread

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODEL = "sim-model"


class SimProcess:
    """`kvgate sim` in its own process on a fixed port, so it can be killed and started again on the same URL."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start and wait for /health."""
        argv = [*KVGATE, "sim", "--port", str(self.port), "--model", MODEL, "--log-level", "warning",
                "--enable-responses-store"]
        self.popen = start_logged(argv, None)
        wait_http(self.url + "/health", 15, self.popen)

    def kill(self) -> None:
        """SIGKILL: a crash, no graceful drain."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(5)

    def requests_served(self) -> float:
        """vllm:request_success_total since this process started."""
        text = httpx.get(self.url + "/metrics", timeout=2).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total{"))


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, SimProcess, SimProcess]]:
    """Gateway URL, survivor and victim (indirect param: upstream.max_migrations, default 1, or a dict of
    upstream settings)."""
    param = getattr(request, "param", 1)
    upstream = {"connect_timeout_s": 1, "retries": 2, "max_migrations": 1,
                **(param if isinstance(param, dict) else {"max_migrations": param})}  # fmt: skip
    sims = [SimProcess(), SimProcess()]
    try:
        for s in sims:
            s.start()
        cfg = parse_config({
            "models": [{"name": MODEL, "pools": ["main"]}],
            "pools": {"main": {"role": "interactive", "served_model": MODEL, "policy": "round_robin",
                               "replicas": [s.url for s in sims],
                               "price": {"input_per_m": 1.0, "output_per_m": 2.0}}},
            "auth": {"required": False},
            "upstream": upstream,
            "routing": {"probe_interval_s": 0.3},
        })  # fmt: skip
        with serve_in_thread(create_app(cfg)) as gw:
            yield gw, sims[0], sims[1]
    finally:
        for s in sims:
            s.kill()


async def _load(client: openai.AsyncOpenAI, until: float, failures: list[str], done: list[int]) -> None:
    while time.monotonic() < until:
        try:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"question {done[0]} about failover"}],
                max_tokens=8,
            )  # fmt: skip
            done[0] += 1
        except openai.APIError as err:
            failures.append(repr(err))


async def test_kill_restart_keeps_non_streaming_requests_whole_and_replica_rejoins(
    cluster: tuple[str, SimProcess, SimProcess],
) -> None:
    gw, _, victim = cluster
    client = openai.AsyncOpenAI(base_url=gw + "/v1", api_key="EMPTY", max_retries=0, timeout=20)
    failures: list[str] = []
    done = [0]
    until = time.monotonic() + 6
    workers = [asyncio.create_task(_load(client, until, failures, done)) for _ in range(8)]
    await asyncio.sleep(1.5)
    await asyncio.to_thread(victim.kill)
    await asyncio.sleep(1.5)
    await asyncio.to_thread(victim.start)
    await asyncio.gather(*workers)
    assert failures == []
    assert done[0] > 0
    # Rejoin: with traffic flowing, the restarted process (counters from 0) serves requests again.
    deadline = time.monotonic() + 10
    while await asyncio.to_thread(victim.requests_served) == 0 and time.monotonic() < deadline:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert await asyncio.to_thread(victim.requests_served) > 0
    async with httpx.AsyncClient() as http:
        assert (await http.get(gw + "/ready")).status_code == 200
    await client.close()


async def _stream(
    http: httpx.AsyncClient, gw: str, i: int, started: asyncio.Event, count: list[int], until_done: bool = False
) -> list[bytes]:
    body = {"model": MODEL, "stream": True, "max_tokens": 400 if until_done else 3000, "ignore_eos": True,
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
                        count[0] += 1
                        if count[0] == 4:
                            started.set()
                    events.append(event[5:].strip())
                    if (not until_done and events[-1] != b"[DONE]" and "error" not in orjson.loads(events[-1])
                            and len(events) > 40):  # fmt: skip
                        return events  # a survivor's stream: long enough, stop reading
    return events


@pytest.mark.parametrize("cluster", [0], indirect=True)
async def test_without_migration_streams_on_a_killed_replica_end_with_an_error_event_then_done(
    cluster: tuple[str, SimProcess, SimProcess],
) -> None:
    gw, _, victim = cluster
    started = asyncio.Event()
    count = [0]
    async with httpx.AsyncClient(timeout=30) as http:
        tasks = [asyncio.create_task(_stream(http, gw, i, started, count)) for i in range(4)]
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.to_thread(victim.kill)
        results = await asyncio.gather(*tasks)
    cut = [events for events in results if events[-1] == b"[DONE]"]
    assert len(cut) == 2  # round robin put two of the four streams on the victim
    for events in cut:
        error = orjson.loads(events[-2])
        assert error["error"]["code"] == "upstream_unreachable"
        assert all("error" not in orjson.loads(e) for e in events[:-2])


async def test_streams_on_a_killed_replica_continue_on_the_survivor_without_an_error(
    cluster: tuple[str, SimProcess, SimProcess],
) -> None:
    gw, _, victim = cluster
    started = asyncio.Event()
    count = [0]
    async with httpx.AsyncClient(timeout=30) as http:
        tasks = [asyncio.create_task(_stream(http, gw, i, started, count, until_done=True)) for i in range(4)]
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.to_thread(victim.kill)
        results = await asyncio.gather(*tasks)
        metrics = (await http.get(gw + "/metrics")).text
    for events in results:
        assert events[-1] == b"[DONE]"
        docs = [orjson.loads(e) for e in events[:-1]]
        assert all("error" not in d for d in docs)
        assert len({d["id"] for d in docs}) == 1 and len({d["created"] for d in docs}) == 1
        roles = [c for d in docs for c in d["choices"] if c["delta"].get("role")]
        finishes = [c["finish_reason"] for d in docs for c in d["choices"] if c.get("finish_reason")]
        assert len(roles) == 1 and finishes == ["length"]
    assert 'gateway_stream_migrations_total{outcome="migrated",pool="main"} 2.0' in metrics
