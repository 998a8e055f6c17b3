"""Poisoned requests cost their sender, not the pool: count_tokens asking for a stream and bodies every engine
fails (sims with --fail-marker) open no breaker; another tenant's requests all succeed meanwhile; the sender is
refused by its failure budget, in its API's envelope, without reaching a replica."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from tests.conftest import running_gateway
from tests.faults.helpers import ATTACKER, VICTIM, chat, poisonable_sims, poisoned, two_tenants

ROUNDS = 40


async def test_poisoned_requests_open_no_breaker_and_spare_another_tenant() -> None:
    with poisonable_sims() as sims, running_gateway(two_tenants(sims)) as gw:
        async with httpx.AsyncClient(base_url=gw, timeout=30) as http:
            bad = {"authorization": f"Bearer {ATTACKER}"}
            good = {"authorization": f"Bearer {VICTIM}"}
            statuses: list[int] = []
            victim: list[int] = []
            for i in range(ROUNDS):
                path, body = poisoned(i)
                r, ok = await asyncio.gather(http.post(path, json=body, headers=bad),
                                             http.post("/v1/chat/completions", json=chat(f"hello {i}"), headers=good))
                statuses.append(r.status_code)
                victim.append(ok.status_code)
                doc = orjson.loads(r.content) if r.headers["content-type"].startswith("application/json") else None
                if path.startswith("/v1/messages") and r.status_code != 200:
                    assert doc is not None and doc["type"] == "error"  # Anthropic's envelope
                if path == "/v1/messages/count_tokens" and r.status_code == 200:
                    assert doc is not None and isinstance(doc["input_tokens"], int)  # JSON, never a stream
            assert victim == [200] * ROUNDS
            assert (await http.get("/ready")).status_code == 200
            assert 429 in statuses  # the budget ran out: later poisoned requests were refused
            assert set(statuses) <= {200, 429, 500}
            metrics = (await http.get("/metrics")).text
    assert serving(metrics) == 2  # both replicas healthy with closed breakers


def serving(metrics: str) -> float:
    """Replicas of the pool serving now (not breaker_open, breaker_half_open or unhealthy), from /metrics."""
    line = next(x for x in metrics.splitlines() if x.startswith("gateway_pool_replicas") and 'state="serving"' in x)
    return float(line.rsplit(" ", 1)[1])
