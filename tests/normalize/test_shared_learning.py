"""Shared learning: what one gateway process learned moves lines on another's first request (real Redis)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import redis

from app.normalize import VolatilityMemory
from app.normalize.memory import RELAX_AFTER_SAMES, fingerprint_key
from app.normalize.rules import RULES
from app.normalize.scan import find_candidates
from app.normalize.shared import SharedLearning
from app.store.base import Store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from app.tenancy import ANONYMOUS
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway
from tests.normalize.helpers import NOW, STATIC_SYSTEM, chat_body, run
from tests.servers import FakeUpstream, free_port
from tests.store.redis_fixtures import loose_redis_store, redis_dump

ALL = frozenset(RULES)
SECRET = "test-secret"
NONCES = ["4f8a2", "91c0e", "a7d13", "0b5f4", "e2c98", "37aa1", "c55e0", "8d1b7"]


def head(i: int) -> str:
    """Claude Code's billing line (a learned nonce) and a per-user id (typed, never presumed volatile)."""
    return (
        f"x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch={NONCES[i % len(NONCES)]};\n"
        f"User ID: user_{9100 + i}\n\n"
    )


def request(i: int) -> dict[str, Any]:
    """One agent-shaped chat request: the volatile head, then static instructions."""
    return chat_body(head(i) + STATIC_SYSTEM, user="where is my parcel?")


def moved(memory: VolatilityMemory, i: int) -> dict[str, int]:
    """The rules that moved in request `i` under tenant "acme"."""
    return run(request(i), memory=memory)[1].moved


@pytest.fixture
async def store(redis_url: str, key_prefix: str) -> AsyncIterator[RedisStore]:
    """A RedisStore on the test's own key prefix."""
    s = loose_redis_store(redis_url, key_prefix)
    try:
        yield s
    finally:
        await s.aclose()


async def learn_on_a(store: Store, requests: int = 3) -> VolatilityMemory:
    """Replica A: serve `requests` requests of tenant acme and write what it learned to the store."""
    a = VolatilityMemory(secret=SECRET)
    for i in range(requests):
        run(request(i), memory=a)
    assert await SharedLearning(a, store, ["acme"]).flush()
    return a


async def fresh_b(store: Store, *, share: bool = True) -> VolatilityMemory:
    """Replica B: a new process's memory, loaded from the store when sharing."""
    b = VolatilityMemory(secret=SECRET)
    if share:
        assert await SharedLearning(b, store, ["acme"]).load()
    return b


@pytest.mark.slow
def test_candidate_keys_are_the_same_in_every_process() -> None:
    text = head(0) + STATIC_SYSTEM
    key = fingerprint_key(SECRET.encode(), "acme")
    here = [c.key for c in find_candidates(text, (0, -1), ALL, NOW, fp_key=key)]
    code = (
        "from tests.normalize.test_shared_learning import *\n"
        "key = fingerprint_key(SECRET.encode(), 'acme')\n"
        "print([c.key for c in find_candidates(head(0) + STATIC_SYSTEM, (0, -1), ALL, NOW, fp_key=key)])"
    )
    outs = []
    for seed in ("1", "2"):  # str hashes differ between these two processes, fingerprints must not
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        outs.append(done.stdout.strip())
    assert here and outs == [str(here), str(here)]


def test_keys_differ_between_tenants_and_secrets() -> None:
    text = head(0) + STATIC_SYSTEM

    def keys(secret: str, tenant: str) -> list[int]:
        fp_key = fingerprint_key(secret.encode(), tenant)
        return [c.key for c in find_candidates(text, (0, -1), ALL, NOW, fp_key=fp_key)]

    assert keys(SECRET, "acme") == keys(SECRET, "acme")
    assert set(keys(SECRET, "acme")).isdisjoint(keys(SECRET, "beta"))
    assert set(keys(SECRET, "acme")).isdisjoint(keys("other", "acme"))


async def test_a_fresh_replica_moves_what_another_learned_on_its_first_request(store: RedisStore) -> None:
    a = await learn_on_a(store)
    assert moved(a, 3) == {"learned": 1, "prefixed_id": 1}  # A's steady state
    warm = await fresh_b(store)
    cold = await fresh_b(store, share=False)
    assert moved(warm, 3) == {"learned": 1, "prefixed_id": 1}  # first request, as A would
    assert moved(cold, 3) == {}  # today's cold start: nothing is known yet


async def test_only_evidence_is_shared_not_presumptions(store: RedisStore) -> None:
    a = VolatilityMemory(secret=SECRET)
    run(chat_body("Request ID: req_8c1f0e5b2a7d4396\n\n" + STATIC_SYSTEM), memory=a)  # presumed volatile
    assert a.for_tenant("acme").has_pending() is False
    run(request(0), memory=a)
    run(request(1), memory=a)  # User ID changed: evidence
    publish, forget = a.for_tenant("acme").take_pending()
    assert len(publish) == 1 and not forget


async def test_shared_keys_count_on_first_sight_only(store: RedisStore) -> None:
    b = VolatilityMemory(secret=SECRET)
    run(request(0), memory=b)  # B has seen the template once: User ID and the nonce are static here
    await learn_on_a(store)
    assert await SharedLearning(b, store, ["acme"]).load()
    assert moved(b, 0) == {}  # same values again: B keeps what it knew
    assert moved(b, 1) == {"prefixed_id": 1}  # its own evidence; the learned line still needs its second change


async def test_a_learned_line_that_settles_is_forgotten_from_the_shared_set(store: RedisStore) -> None:
    a = await learn_on_a(store)
    shared = SharedLearning(a, store, ["acme"])
    for _ in range(RELAX_AFTER_SAMES):
        run(request(3), memory=a)  # the nonce stopped changing: the line settles on A
    assert moved(a, 3) == {"prefixed_id": 1}
    assert await shared.flush()
    b = await fresh_b(store)
    assert moved(b, 3) == {"prefixed_id": 1}  # B starts where A ended: the settled line stays in place


async def test_an_unreachable_store_fails_open_and_writes_later(store: RedisStore) -> None:
    down = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:", socket_timeout_s=0.2)
    a = VolatilityMemory(secret=SECRET)
    shared = SharedLearning(a, down, ["acme"])
    try:
        assert await shared.load() is False
        assert [moved(a, i) for i in range(3)] == [{}, {"prefixed_id": 1}, {"learned": 1, "prefixed_id": 1}]
        assert await shared.flush() is False  # kept for the next round
        assert a.pending_tenants() == ["acme"]
    finally:
        await down.aclose()
    shared.store = store
    assert await shared.flush() and a.pending_tenants() == []
    assert moved(await fresh_b(store), 3) == {"learned": 1, "prefixed_id": 1}


async def test_what_redis_holds_contains_no_prompt_text(redis_url: str, key_prefix: str, store: RedisStore) -> None:
    await learn_on_a(store, requests=4)
    held = redis_dump(redis_url, key_prefix)
    assert held, "nothing was written"
    prompts = [head(i) + STATIC_SYSTEM + "where is my parcel?" for i in range(4)]
    pieces = {p[k : k + 6] for p in prompts for k in range(len(p) - 5)}
    for item in held:
        text = item.removeprefix(key_prefix).replace("{acme}:volatile", "")  # our prefix, tenant id, key name
        assert text.isdigit() or text == "", item
        assert not any(piece in text for piece in pieces), item


async def test_memory_store_shares_between_gateways_in_one_process() -> None:
    store = MemoryStore()
    await learn_on_a(store)
    assert moved(await fresh_b(store), 3) == {"learned": 1, "prefixed_id": 1}


def gateway(url: str, redis_url: str, key_prefix: str, *, share: bool) -> Any:
    return gateway_config(
        [url],
        store={"url": redis_url, "key_prefix": key_prefix},
        tenants=[{"id": ANONYMOUS, "normalize": "on"}],
        normalize={"salt_secret": SECRET, "share_learning": share, "shared_refresh_s": 0.05},
    )


def wait_for_shared(redis_url: str, key_prefix: str, n: int) -> None:
    """Until the anonymous tenant's shared set holds `n` fingerprints (a gateway flushes every 0.05 s)."""
    client = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 5
        while client.zcard(f"{key_prefix}{{{ANONYMOUS}}}:volatile") < n:
            assert time.monotonic() < deadline, "the gateway did not write its learning"
            time.sleep(0.05)
    finally:
        client.close()


def first_header(base: str, i: int) -> str:
    """`x-kvgate-normalized` of one chat request through the gateway (the official SDK)."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="EMPTY", max_retries=0)
    body = request(i)
    raw = client.chat.completions.with_raw_response.create(model=PUBLIC_MODEL, messages=body["messages"])
    client.close()
    return raw.headers["x-kvgate-normalized"]


def test_a_gateway_loads_shared_learning_before_its_first_request(
    fake_upstream: tuple[FakeUpstream, str], redis_url: str, key_prefix: str
) -> None:
    _, url = fake_upstream
    with running_gateway(gateway(url, redis_url, key_prefix, share=True)) as a:
        headers = [first_header(a, i) for i in range(3)]
        assert headers[2].startswith("on;moved=2")
        wait_for_shared(redis_url, key_prefix, 2)
    with running_gateway(gateway(url, redis_url, key_prefix, share=True)) as b:
        assert first_header(b, 5).startswith("on;moved=2;rules=learned:1,prefixed_id:1")
    with running_gateway(gateway(url, redis_url, key_prefix, share=False)) as cold:
        assert first_header(cold, 6) == "on;moved=0"


def test_the_refresh_task_picks_up_what_another_gateway_learns_later(
    fake_upstream: tuple[FakeUpstream, str], redis_url: str, key_prefix: str
) -> None:
    _, url = fake_upstream
    cfg = gateway(url, redis_url, key_prefix, share=True)
    with running_gateway(cfg) as b, running_gateway(cfg) as a:  # b started before anything was learned
        assert [first_header(a, i) for i in range(3)][2].startswith("on;moved=2")
        wait_for_shared(redis_url, key_prefix, 2)
        time.sleep(0.3)  # a few of b's refresh rounds (every 0.05 s)
        assert first_header(b, 5).startswith("on;moved=2;rules=learned:1,prefixed_id:1")
