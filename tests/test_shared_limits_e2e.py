"""Two real `kvgate serve` processes sharing one Redis, in front of a `kvgate sim`, driven by the openai SDK.

Pins the issue's end-to-end claims: one RPM limit enforced jointly by both gateways (exactly the
allowed number of concurrent requests succeed), and spend recorded in Redis equal to the sum of the
per-response x-kvgate-cost-usd headers to the cent.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest
import redis
import yaml

from app.sim.testing import running_sim
from tests.servers import free_port
from tests.store.redis_fixtures import redis_url

__all__ = ["redis_url"]

pytestmark = pytest.mark.slow

LIMITED_KEY, SPENDER_KEY, ADMIN_KEY = "sk-e2e-limited", "sk-e2e-spender", "sk-e2e-admin"
RPM = 12


def start_gateway(config: Path, port: int) -> subprocess.Popen[bytes]:
    kvgate = Path(sys.executable).parent / "kvgate"
    return subprocess.Popen(
        [str(kvgate), "serve", "--config", str(config), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"gateway exited: {err[-2000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("gateway not ready in 60 s")


@pytest.fixture(scope="module")
def gateways(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two gateway processes (separate Redis pools, separate caches) sharing one Redis and one sim."""
    prefix = f"kvgate-e2e:{uuid.uuid4().hex[:8]}:"
    with running_sim(model="served", time_scale=50.0, profile="h100-8b") as sim:
        cfg = {
            "store": {"url": redis_url, "key_prefix": prefix, "fail_mode": "open"},
            "models": [{"name": "m", "pools": ["main"]}],
            "pools": {
                "main": {
                    "role": "interactive",
                    "served_model": "served",
                    "replicas": [sim],
                    "price": {"input_per_m": 0.8, "cached_input_per_m": 0.08, "output_per_m": 2.4},
                }
            },
            "tenants": [
                {"id": "limited", "api_keys": [LIMITED_KEY], "limits": {"rpm": RPM}},
                {"id": "spender", "api_keys": [SPENDER_KEY]},
            ],
            "auth": {"required": True, "admin_keys": [ADMIN_KEY]},
        }
        path = tmp_path_factory.mktemp("e2e") / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        ports = [free_port(), free_port()]
        procs = [start_gateway(path, p) for p in ports]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        try:
            for url, proc in zip(urls, procs, strict=True):
                wait_ready(url, proc)
            yield urls
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=15)
            client = redis.Redis.from_url(redis_url)
            for key in client.scan_iter(match=f"{prefix}*", count=500):
                client.delete(key)
            client.close()


def clients(urls: list[str], key: str) -> list[openai.AsyncOpenAI]:
    return [openai.AsyncOpenAI(base_url=f"{u}/v1", api_key=key, max_retries=0, timeout=30) for u in urls]


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
        for _ in range(100):  # settle runs after the response: wait for the last records to land
            total = (await http.get("/admin/tenants/spender/usage?days=1")).json()["total"]
            if total["requests"] >= 1000:
                break
            await asyncio.sleep(0.1)
    assert total["requests"] == 1000
    assert header_sum > 0
    assert abs(Decimal(total["usd_micros"]) / 1_000_000 - header_sum) < Decimal("0.005")
