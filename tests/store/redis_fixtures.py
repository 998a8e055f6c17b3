"""A real Redis for tests: REDIS_URL if set, else a throwaway `redis-server` on a free port.

Tests never FLUSH: each gets its own key prefix and deletes only its own keys afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from app.store.base import Store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from tests.servers import free_port


@dataclass
class RedisServer:
    """One redis-server process we own: can be stopped and started again on the same port and dir."""

    workdir: Path
    appendonly: bool = False
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """redis:// URL of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart) the server and wait until it answers PING."""
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server not installed and REDIS_URL not set")
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes" if self.appendonly else "no", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM: Redis fsyncs its AOF before exiting)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a Redis shared by the session's tests (REDIS_URL, or our own throwaway server)."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server only this test uses (with AOF on), so the test may stop and restart it."""
    server = RedisServer(tmp_path, appendonly=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix unique to this test; its keys are deleted afterwards (nothing else is touched)."""
    prefix = f"kvgate-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{prefix}*", count=500):
        client.delete(key)
    client.close()


@pytest.fixture(params=["memory", "redis", "redis-py"])
async def any_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """Each test runs once per Store implementation (Redis with and without the RESP hot path): all alike."""
    if request.param == "memory":
        yield MemoryStore()
        return
    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("key_prefix")
    store = loose_redis_store(url, prefix, fast_path=request.param == "redis")
    try:
        yield store
    finally:
        await store.aclose()


def loose_redis_store(url: str, prefix: str, **kw: float | bool) -> RedisStore:
    """A RedisStore with timeouts loose enough for a loaded test machine (fail-mode tests set their own)."""
    kw.setdefault("socket_timeout_s", 2.0)
    return RedisStore(url, prefix, **kw)  # type: ignore[arg-type]


def redis_dump(url: str, prefix: str) -> list[str]:
    """Every key under `prefix` and every value in it, as text (to check what the store holds)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    out: list[str] = []
    for key in client.scan_iter(match=f"{prefix}*", count=500):
        out.append(key)
        kind = client.type(key)
        if kind == "string":
            out.append(str(client.get(key)))
        elif kind == "set":
            out.extend(str(m) for m in client.smembers(key))
        elif kind == "hash":
            for k, v in client.hgetall(key).items():
                out += [str(k), str(v)]
        elif kind == "zset":
            out.extend(str(m) for m in client.zrange(key, 0, -1))
    client.close()
    return out
