"""A real Redis for tests: REDIS_URL if set, else a throwaway `redis-server` on a free port.

Tests never FLUSH: each gets its own key prefix and deletes only its own keys afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from app.store.base import Store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from kvlab.redis_server import RedisNotInstalled
from kvlab.redis_server import RedisServer as RedisServer  # re-exported: the tests' type hints


def _start_or_skip(server: RedisServer) -> None:
    try:
        server.start()
    except RedisNotInstalled as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a Redis shared by the session's tests (REDIS_URL, or our own throwaway server)."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    _start_or_skip(server)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server only this test uses (with AOF on), so the test may stop and restart it."""
    server = RedisServer(tmp_path, appendonly=True)
    _start_or_skip(server)
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
