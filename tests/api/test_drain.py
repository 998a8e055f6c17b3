"""Graceful drain of `kvgate serve` (a subprocess in front of a slow sim): on SIGTERM /ready turns 503 at once, the
listener stops accepting after the notice, the stream in flight finishes with its final chunk, its spend reaches
the store, and the process exits 0 within listen.drain_s."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson
import pytest

from app.sim.testing import running_sim
from app.store.redis_store import RedisStore
from tests.conftest import PUBLIC_MODEL
from tests.servers import free_port

# Real processes and seconds-long waits: the slow tier (scripts/test.sh runs it after the fast one).
pytestmark = pytest.mark.slow

DRAIN_S = 15.0
NOTICE_S = 1.0
# cpu-smollm2 decodes at ~70 ms a token at batch 1: 40 tokens is a stream of ~3 s, longer than the notice.
TOKENS = 40


def config(sim: str, port: int, redis_url: str, prefix: str) -> dict[str, object]:
    return {
        "listen": {"host": "127.0.0.1", "port": port, "drain_s": DRAIN_S, "drain_notice_s": NOTICE_S},
        "models": [{"name": PUBLIC_MODEL, "pools": ["main"]}],
        "pools": {"main": {"role": "interactive", "served_model": "served-model", "replicas": [sim],
                           "price": {"input_per_m": 1.0, "cached_input_per_m": 0.1, "output_per_m": 2.0}}},
        "auth": {"required": True},
        "tenants": [{"id": "acme", "api_keys": ["sk-acme"]}],
        "store": {"url": redis_url, "key_prefix": prefix, "socket_timeout_s": 2.0},
        "routing": {"probe_interval_s": 0.2, "healthy_after": 1, "unhealthy_after": 1},
        "upstream": {"read_timeout_s": 30},
    }


def month_spend(redis_url: str, prefix: str) -> int:
    async def read() -> int:
        store = RedisStore(redis_url, prefix, socket_timeout_s=2.0)
        try:
            return await store.month_spend_micros("acme", datetime.now(UTC).strftime("%Y-%m"))
        finally:
            await store.aclose()

    return asyncio.run(read())


def test_sigterm_drains_the_stream_in_flight_and_exits_0(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_sim(model="served-model", profile="cpu-smollm2") as sim:
        path = tmp_path / "kvgate.yaml"
        path.write_text(json.dumps(config(sim, port, redis_url, key_prefix)))  # JSON is YAML
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--config", str(path)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 30
            while b"kvgate ready on" not in proc.stdout.readline():
                assert time.monotonic() < deadline and proc.poll() is None, "kvgate serve did not start"
            assert httpx.get(base + "/ready").status_code == 200

            events: list[bytes] = []
            first = threading.Event()

            def stream() -> None:
                body = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "count to fifty"}],
                        "stream": True, "max_tokens": TOKENS, "ignore_eos": True}
                headers = {"authorization": "Bearer sk-acme"}
                with httpx.stream("POST", base + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:].encode())
                            first.set()

            reader = threading.Thread(target=stream)
            reader.start()
            assert first.wait(15), "the stream did not start"
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()

            ready = httpx.get(base + "/ready", timeout=2)
            not_ready_after = time.monotonic() - signalled
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            assert not_ready_after < 0.5

            time.sleep(NOTICE_S + 0.5)
            assert reader.is_alive(), "the stream should outlast the notice"
            with pytest.raises(httpx.ConnectError):
                httpx.get(base + "/health", timeout=2)  # no longer accepting

            reader.join(timeout=DRAIN_S)
            rc = proc.wait(timeout=DRAIN_S)
            exited_after = time.monotonic() - signalled
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert rc == 0 and exited_after < DRAIN_S
        assert events[-1] == b"[DONE]"
        chunks = [orjson.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks)
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        assert len(content) == TOKENS
        assert month_spend(redis_url, key_prefix) > 0
