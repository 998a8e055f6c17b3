"""The sim publishes vLLM 0.32's KV events, and a KvEventsHub fed by them predicts the sim's cached tokens.

Each test runs a real sim (uvicorn in a thread) with --kv-events and reads its stream with the gateway's own
subscriber (app.kvcache.subscriber) or a raw ZMQ socket; prompts are hashed with app.kvcache.tokens over a
tiny model folder that the sim is given too, exactly as a gateway with the same folder would.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq
import zmq.asyncio
from openai import AsyncOpenAI

from app.kvcache.hashing import block_hashes
from app.kvcache.subscriber import EventSource, KvEventsHub
from app.kvcache.tokens import RequestBlocks
from app.sim.testing import free_port, running_sim
from tests.sim.tiny_model import build_tiny_model

BS = 16
TOPIC = "kv"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def endpoints(tmp_path: Path) -> tuple[str, str]:
    """A PUB endpoint the sim binds (ipc: vLLM binds ipc://, and it stays on this host) and a loopback replay."""
    return f"ipc://{tmp_path}/kv.pub", f"tcp://127.0.0.1:{free_port()}"


async def until(cond: Callable[[], bool], within: float = 10.0) -> None:
    """Wait for `cond`: events cross real sockets and the engine's step first."""
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


def prompt(n_facts: int = 12) -> list[dict[str, str]]:
    """A unique chat prompt of several 16-token blocks."""
    facts = " ".join(f"Fact {i}: item {i} weighs {i * 7} grams." for i in range(n_facts))
    text = f"Session {uuid.uuid4().hex[:8]}. {facts}"
    return [{"role": "user", "content": text}]


@asynccontextmanager
async def hub_for(url: str, pub: str, replay: str | None, *, bind: bool = False) -> AsyncIterator[KvEventsHub]:
    hub = KvEventsHub([EventSource(url, pub, replay, topic=TOPIC, bind=bind)])
    await hub.start()
    try:
        yield hub
    finally:
        await hub.stop()


async def whole(hub: KvEventsHub, url: str) -> None:
    await until(lambda: hub.is_whole(url))
    await asyncio.sleep(0.2)  # ZMQ slow joiner: the subscription must reach the PUB before the next frame


async def chat(base: str, messages: list[dict[str, str]], **extra: Any) -> Any:
    async with AsyncOpenAI(base_url=f"{base}/v1", api_key="none") as client:
        return await client.chat.completions.create(
            model="sim", messages=messages, max_tokens=1, extra_body=extra or None  # type: ignore[arg-type]
        )


async def replayed(replay: str) -> list[tuple[bytes, int, list[Any]]]:
    """Every buffered batch, through vLLM's replay protocol: (topic, seq, decoded EventBatch)."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(replay)
    out: list[tuple[bytes, int, list[Any]]] = []
    try:
        await sock.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            frames = await asyncio.wait_for(sock.recv_multipart(), 5)
            assert frames[0] == b"" and len(frames) == 4
            assert len(frames[2]) == 8
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq == -1:
                assert frames[1] == b"" and frames[3] == b""
                return out
            out.append((frames[1], seq, msgspec.msgpack.decode(frames[3])))
    finally:
        sock.close(linger=0)
        ctx.term()


def events_of(batches: list[tuple[bytes, int, list[Any]]], kind: str) -> list[dict[str, Any]]:
    return [e for _t, _s, b in batches for e in b[1] if e["type"] == kind]


@pytest.fixture
def sim(model: Path, endpoints: tuple[str, str]) -> Iterator[str]:
    with running_sim(
        tokenizer=str(model), block_size=BS, kv_blocks=400, kv_events=endpoints[0], kv_replay=endpoints[1],
        kv_topic=TOPIC,
    ) as base:
        yield base


async def test_a_request_publishes_block_stored_in_vllms_wire_format(
    sim: str, model: Path, endpoints: tuple[str, str]
) -> None:
    messages = prompt()
    rb = RequestBlocks(model, BS)
    ids = rb.token_ids({"messages": messages})
    async with hub_for(sim, *endpoints) as hub:
        await whole(hub, sim)
        await chat(sim, messages)
        hashes = rb.hashes_for_tokens(ids)
        assert len(hashes) >= 4
        await until(lambda: hub.overlap_blocks(sim, hashes) == len(hashes))
        assert hub.stats(sim).gaps == 0
    got = await replayed(endpoints[1])
    assert [s for _t, s, _b in got] == list(range(len(got)))  # seq from 0, one per engine step with events
    assert all(t == TOPIC.encode() for t, _s, _b in got)
    ts, batch_events, dp_rank = got[0][2]
    assert isinstance(ts, float) and dp_rank == 0 and batch_events
    stored = events_of(got, "BlockStored")
    # vLLM's field order and values: ints of the low 64 bits, chained parent, the block's own tokens.
    first = stored[0]
    assert list(first) == ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                           "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"]
    assert first["parent_block_hash"] is None and first["medium"] == "GPU" and first["block_size"] == BS
    assert first["group_idx"] == 0 and first["kv_cache_spec_kind"] == "full_attention"
    published = [h for e in stored for h in e["block_hashes"]]
    assert published[: len(hashes)] == hashes
    assert [t for e in stored for t in e["token_ids"]][: len(hashes) * BS] == ids[: len(hashes) * BS]
    assert first["extra_keys"] == [None] * len(first["block_hashes"])


async def test_predicted_overlap_equals_the_cached_tokens_the_sim_reports(
    sim: str, model: Path, endpoints: tuple[str, str]
) -> None:
    rb = RequestBlocks(model, BS)
    async with hub_for(sim, *endpoints) as hub:
        await whole(hub, sim)
        for salt in (None, "tenant-a"):
            messages = prompt()
            body: dict[str, Any] = {"messages": messages, **({"cache_salt": salt} if salt else {})}
            pb = rb.blocks(body)
            assert hub.overlap_blocks(sim, pb.hashes) == 0
            extra = {"cache_salt": salt} if salt else {}
            first = await chat(sim, messages, **extra)
            assert first.usage.prompt_tokens == pb.n_tokens  # the sim tokenized through the same code path
            want = pb.hashes
            await until(lambda: hub.overlap_blocks(sim, want) == len(want))  # noqa: B023 (awaited right here)
            predicted = hub.overlap_blocks(sim, pb.hashes)
            second = await chat(sim, messages, **extra)
            cached = second.usage.prompt_tokens_details.cached_tokens
            # vLLM (and the sim) recompute the last prompt token, so a hit is capped at n-1 tokens.
            assert cached == min(predicted, (pb.n_tokens - 1) // BS) * BS
            assert cached // BS == min(predicted, (pb.n_tokens - 1) // BS) > 0
        unsalted = rb.blocks({"messages": messages}).hashes
        assert set(unsalted).isdisjoint(pb.hashes)  # the salt in block 0 changed every hash of the chain
        assert hub.overlap_blocks(sim, unsalted) < len(unsalted)
    salted = [e for e in events_of(await replayed(endpoints[1]), "BlockStored") if e["extra_keys"][0]]
    assert salted and salted[0]["extra_keys"][0] == ["tenant-a"] and salted[0]["parent_block_hash"] is None


async def test_eviction_publishes_block_removed_and_the_index_forgets(model: Path, endpoints: tuple[str, str]) -> None:
    rb = RequestBlocks(model, BS)
    a, b = prompt(), prompt()
    ha, hb = rb.blocks({"messages": a}).hashes, rb.blocks({"messages": b}).hashes
    kv_blocks = len(hb) + 2  # room for one prompt only: B's prefill must evict A's cached blocks
    with running_sim(tokenizer=str(model), block_size=BS, kv_blocks=kv_blocks, kv_events=endpoints[0],
                     kv_replay=endpoints[1], kv_topic=TOPIC) as base:
        async with hub_for(base, *endpoints) as hub:
            await whole(hub, base)
            await chat(base, a)
            await until(lambda: hub.overlap_blocks(base, ha) == len(ha))
            await chat(base, b)
            await until(lambda: hub.overlap_blocks(base, hb) == len(hb))
            assert hub.overlap_blocks(base, ha) < len(ha)
            removed = events_of(await replayed(endpoints[1]), "BlockRemoved")
            gone = {h for e in removed for h in e["block_hashes"]}
            assert all(list(e) == ["type", "block_hashes", "medium", "group_idx"] for e in removed)
            assert all(len(e["block_hashes"]) == 1 and e["medium"] == "GPU" for e in removed)  # one per block
            assert gone and gone <= set(ha)
            # What the hub still holds for A is what the sim still has: a repeat of A hits exactly that.
            predicted = hub.overlap_blocks(base, ha)
            again = await chat(base, a)
            assert again.usage.prompt_tokens_details.cached_tokens == predicted * BS


async def test_late_subscriber_catches_up_through_replay(sim: str, model: Path, endpoints: tuple[str, str]) -> None:
    rb = RequestBlocks(model, BS)
    chains = []
    for _ in range(3):
        messages = prompt()
        await chat(sim, messages)
        chains.append(rb.blocks({"messages": messages}).hashes)
    async with hub_for(sim, *endpoints) as hub:  # joins after the events were published
        await until(lambda: hub.is_whole(sim) and all(hub.overlap_blocks(sim, c) == len(c) for c in chains))
        assert hub.stats(sim).replays >= 1
        last = hub.stats(sim).last_seq
        assert last is not None and last >= 2


async def test_reset_prefix_cache_publishes_all_blocks_cleared(
    sim: str, model: Path, endpoints: tuple[str, str]
) -> None:
    rb = RequestBlocks(model, BS)
    messages = prompt()
    hashes = rb.blocks({"messages": messages}).hashes
    async with hub_for(sim, *endpoints) as hub:
        await whole(hub, sim)
        await chat(sim, messages)
        await until(lambda: hub.overlap_blocks(sim, hashes) == len(hashes))
        async with httpx.AsyncClient() as client:
            r = await client.post(f"{sim}/reset_prefix_cache")
        assert r.json() == {"success": True}
        await until(lambda: hub.overlap_blocks(sim, hashes) == 0)
        assert hub.is_whole(sim)
    assert events_of(await replayed(endpoints[1]), "AllBlocksCleared") == [{"type": "AllBlocksCleared"}]


async def test_sim_connects_to_a_collector_that_binds() -> None:
    collector, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    # A concrete host: the sim connects out, as vLLM does; the hub binds the collector first.
    hub = KvEventsHub([EventSource("http://sim", collector, replay, topic=TOPIC, bind=True)])
    await hub.start()
    try:
        with running_sim(block_size=BS, kv_events=collector, kv_replay=replay, kv_topic=TOPIC) as base:
            messages = prompt()
            async with httpx.AsyncClient() as client:
                ids = (await client.post(f"{base}/tokenize", json={"messages": messages})).json()["tokens"]
            hashes = block_hashes(ids, BS)  # the built-in tokenizer: ids from the sim's own /tokenize
            await until(lambda: hub.is_whole("http://sim"))
            await asyncio.sleep(0.3)
            await chat(base, messages)
            await until(lambda: hub.overlap_blocks("http://sim", hashes) == len(hashes))
            second = await chat(base, messages)
            assert second.usage.prompt_tokens_details.cached_tokens == min(len(hashes), (len(ids) - 1) // BS) * BS
    finally:
        await hub.stop()


def test_no_events_without_an_endpoint_and_bad_settings_are_refused() -> None:
    from app.sim.options import SimOptions
    from app.sim.state import SimState

    assert SimState(SimOptions()).engine.pool.events is None
    with pytest.raises(ValueError, match="kv_replay needs kv_events"):
        SimState(SimOptions(kv_replay="tcp://*:5558"))
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        SimOptions(prefix_caching_hash_algo="xxhash").hash_algo()
