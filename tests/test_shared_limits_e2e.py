"""Two real `kvgate serve` processes sharing one Redis, in front of a `kvgate sim`, driven by the openai SDK.

Pins the issue's end-to-end claims: one RPM limit enforced jointly by both gateways (exactly the
allowed number of concurrent requests succeed); spend recorded in Redis equal to the sum of the
per-response x-kvgate-cost-usd headers to the cent; and across a Redis restart, a fail_mode "open"
gateway keeps serving and loses no spend while a fail_mode "closed" one answers 503 until Redis is back.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest
import redis
import yaml

from app.sim.testing import running_sim
from kvlab.configs import gateway_config
from tests.gateway_process import GatewayProcess
from tests.servers import free_port
from tests.store.redis_fixtures import RedisServer

pytestmark = pytest.mark.slow

LIMITED_KEY, SPENDER_KEY, ADMIN_KEY = "sk-e2e-limited", "sk-e2e-spender", "sk-e2e-admin"
RPM = 12


def shared_config(sim: str, redis: str, prefix: str, fail_mode: str) -> dict[str, object]:
    """One model on one sim pool; a rate-limited tenant and a spending tenant (limits set, never hit)."""
    return gateway_config(
        {"main": {"role": "interactive", "replicas": [sim]}},
        served_model="served",
        price={"input_per_m": 0.8, "cached_input_per_m": 0.08, "output_per_m": 2.4},
        tenants=[
            {"id": "limited", "api_keys": [LIMITED_KEY], "limits": {"rpm": RPM}},
            {"id": "spender", "api_keys": [SPENDER_KEY], "limits": {"rpm": 1_000_000}},
        ],
        store={"url": redis, "key_prefix": prefix, "fail_mode": fail_mode},
        auth={"required": True, "admin_keys": [ADMIN_KEY]},
        # A drain shorter than the teardown's wait: a process still running after it is a hang, not a drain.
        listen={"drain_s": 5.0},
    )


@contextmanager
def serving(configs: list[dict[str, object]], workdir: Path) -> Iterator[list[str]]:
    """One `kvgate serve` process per config, each on its own port; yields their base URLs."""
    ports = [free_port() for _ in configs]
    procs = []
    for i, (cfg, port) in enumerate(zip(configs, ports, strict=True)):
        path = workdir / f"gateway-{i}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        args = ["serve", "--config", str(path), "--port", str(port), "--log-level", "info"]
        procs.append(GatewayProcess.start(args, workdir / f"gateway-{i}.log"))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url, proc in zip(urls, procs, strict=True):
            proc.wait_ready(url)
        yield urls
    finally:
        for proc in procs:
            proc.proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def gateways(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two gateway processes (separate Redis pools, separate caches) sharing one Redis and one sim."""
    prefix = f"kvgate-e2e:{uuid.uuid4().hex[:8]}:"
    with running_sim(model="served", time_scale=50.0, profile="h100-8b") as sim:
        cfg = shared_config(sim, redis_url, prefix, "open")
        try:
            with serving([cfg, cfg], tmp_path_factory.mktemp("e2e")) as urls:
                yield urls
        finally:
            client = redis.Redis.from_url(redis_url)
            for key in client.scan_iter(match=f"{prefix}*", count=500):
                client.delete(key)
            client.close()


def clients(urls: list[str], key: str) -> list[openai.AsyncOpenAI]:
    # No retries: a retried request would be counted twice. A generous timeout: on a loaded 2-core machine one
    # request of a 1,000-request run may wait tens of seconds behind the others, and that is not what is tested.
    return [openai.AsyncOpenAI(base_url=f"{u}/v1", api_key=key, max_retries=0, timeout=120) for u in urls]


async def test_two_gateways_enforce_one_rpm_limit_jointly(gateways: list[str]) -> None:
    sdk = clients(gateways, LIMITED_KEY)

    async def one(i: int) -> int | str:
        try:
            await sdk[i % 2].chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=2
            )
            return 200
        except openai.RateLimitError as err:
            assert err.response.headers["retry-after"].isdigit()
            return str(err.code)

    outcomes = await asyncio.gather(*(one(i) for i in range(3 * RPM)))
    for c in sdk:
        await c.close()
    assert outcomes.count(200) == RPM
    assert outcomes.count("rate_limit_exceeded") == 2 * RPM


async def test_spend_of_1000_mixed_requests_equals_the_sum_of_cost_headers(gateways: list[str]) -> None:
    sdk = clients(gateways, SPENDER_KEY)
    rng = random.Random(1000)
    sem = asyncio.Semaphore(16)
    header_sum = Decimal(0)
    system = "You are a terse assistant. " * 40  # a shared prefix, so some requests hit the cache

    async def one(i: int) -> None:
        nonlocal header_sum
        messages = [{"role": "user", "content": "q" * rng.randint(1, 600) + f" {i}"}]
        if rng.random() < 0.5:
            messages.insert(0, {"role": "system", "content": system})
        async with sem:
            raw = await sdk[i % 2].chat.completions.with_raw_response.create(
                model="m", messages=messages, max_tokens=rng.randint(1, 24)  # type: ignore[arg-type]
            )
        header_sum += Decimal(raw.headers["x-kvgate-cost-usd"])

    await asyncio.gather(*(one(i) for i in range(1000)))
    for c in sdk:
        await c.close()
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=gateways[0], headers=admin) as http:
        deadline = time.monotonic() + 60  # settle runs after the response: wait for the last records to land
        while True:
            total = (await http.get("/admin/tenants/spender/usage?days=1")).json()["total"]
            if total["requests"] >= 1000 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    assert total["requests"] == 1000
    assert header_sum > 0
    assert abs(Decimal(total["usd_micros"]) / 1_000_000 - header_sum) < Decimal("0.005")


async def spend_requests(sdk: openai.AsyncOpenAI, n: int) -> tuple[Decimal, list[str]]:
    """n small requests; the sum of their cost headers and their x-kvgate-limit notes."""
    total, notes = Decimal(0), []
    for i in range(n):
        raw = await sdk.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "x" * (i % 50 + 1)}], max_tokens=i % 7 + 1
        )
        total += Decimal(raw.headers["x-kvgate-cost-usd"])
        notes.append(raw.headers.get("x-kvgate-limit", ""))
    return total, notes


async def test_redis_restart_fail_open_keeps_serving_and_loses_no_spend_fail_closed_503s(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    prefix = "kvgate:"
    with running_sim(model="served", time_scale=50.0, profile="h100-8b") as sim:
        configs = [shared_config(sim, own_redis.url, prefix, mode) for mode in ("open", "closed")]
        with serving(configs, tmp_path) as (open_url, closed_url):
            opened, closed = clients([open_url, closed_url], SPENDER_KEY)
            before, _ = await spend_requests(opened, 50)
            own_redis.stop()
            during, notes = await spend_requests(opened, 50)  # fail open: served, unenforced
            assert notes == ["unenforced:store_unavailable"] * 50
            with pytest.raises(openai.InternalServerError) as err:
                await closed.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            assert err.value.status_code == 503 and err.value.code == "store_unavailable"
            own_redis.start()  # same port and AOF directory
            await asyncio.sleep(0.6)  # past the store's fail-fast cool-off
            after, _ = await spend_requests(opened, 50)
            for _ in range(20):  # closed mode serves again once Redis answers
                try:
                    await closed.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                    break
                except openai.InternalServerError:
                    await asyncio.sleep(0.25)
            else:
                pytest.fail("fail_mode closed gateway did not recover")
            await opened.close()
            await closed.close()
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            async with httpx.AsyncClient(base_url=open_url, headers=admin) as http:
                for _ in range(50):  # the buffered 50 are flushed by the gateway's background flusher
                    total = (await http.get("/admin/tenants/spender/usage?days=1")).json()["total"]
                    if total["requests"] >= 151:
                        break
                    await asyncio.sleep(0.2)
    assert total["requests"] == 151  # 150 through the open gateway, 1 through the closed one
    assert abs(Decimal(total["usd_micros"]) / 1_000_000 - (before + during + after)) < Decimal("0.005")
