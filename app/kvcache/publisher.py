"""vLLM 0.32's KV-event publisher (vllm/distributed/kv_events.py ZmqEventPublisher) on asyncio, for the sim and tests.

Wire format, as vLLM sends it: a PUB multipart ``[topic, seq (8 bytes big-endian), msgpack EventBatch]`` with
seq counting from 0 per process; EventBatch is the array ``[ts, events, data_parallel_rank]`` and each event a
map tagged by ``"type"`` with default-valued fields omitted (msgspec ``omit_defaults``). A ROUTER replay socket
answers a DEALER's ``[b"", start_seq]`` with every buffered batch ``seq >= start`` as
``[id, b"", topic, seq, payload]`` and ends with ``[id, b"", b"", -1, b""]``; the buffer keeps the last
``buffer_steps`` batches.

vLLM publishes from a thread; here PUB sends happen on the caller's loop (a PUB send never blocks: past the
high-water mark ZMQ drops, as it does for vLLM) and replay is served by one asyncio task.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import zmq
import zmq.asyncio

from app.kvcache.sources import is_bind_endpoint

END_SEQ_BYTES: Final = (-1).to_bytes(8, "big", signed=True)
BUFFER_STEPS: Final = 10_000  # vLLM's KVEventsConfig.buffer_steps default
PUB_HWM: Final = 100_000  # vLLM's KVEventsConfig.hwm default
KV_SPEC_FULL_ATTENTION: Final = "full_attention"


class BlockStoredEvent(msgspec.Struct, tag="BlockStored", omit_defaults=True, gc=False):
    """vLLM's BlockStored, field for field and in order (what a vLLM subscriber decodes)."""

    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemovedEvent(msgspec.Struct, tag="BlockRemoved", omit_defaults=True, gc=False):
    """vLLM's BlockRemoved (it sends one per evicted block)."""

    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksClearedEvent(msgspec.Struct, tag="AllBlocksCleared", omit_defaults=True, gc=False):
    """vLLM's AllBlocksCleared (reset_prefix_cache)."""


class _EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KvEventPublisher:
    """PUB (bind or connect, by vLLM's rule on the endpoint) plus an optional ROUTER replay socket."""

    def __init__(
        self,
        endpoint: str,
        replay: str | None = None,
        *,
        topic: str = "",
        buffer_steps: int = BUFFER_STEPS,
        hwm: int = PUB_HWM,
        bind: bool | None = None,
        data_parallel_rank: int = 0,
    ) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.set_hwm(hwm)
        if bind if bind is not None else is_bind_endpoint(endpoint):
            self.pub.bind(endpoint)
        else:
            self.pub.connect(endpoint)
        self.replay: zmq.asyncio.Socket | None = None
        if replay is not None:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(replay)
        self.topic = topic.encode()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.seq = 0
        self.replay_requests = 0
        self.dp_rank = data_parallel_rank
        self._encoder = msgspec.msgpack.Encoder()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Serve replay requests (needs a running loop); idempotent."""
        if self.replay is not None and self._task is None:
            self._task = asyncio.create_task(self._serve_replay(), name="kv-events-replay")

    def encode(self, events: Sequence[Any], ts: float | None = None) -> bytes:
        """One EventBatch payload of msgspec-encodable events (structs above, or plain dicts)."""
        batch = _EventBatch(time.time() if ts is None else ts, list(events), self.dp_rank)
        return self._encoder.encode(batch)

    def publish(self, events: Sequence[Any], *, send: bool = True, ts: float | None = None) -> int:
        """Publish one batch (send=False only buffers it: a lost PUB frame, for tests); returns its seq."""
        return self.publish_payload(self.encode(events, ts), send=send)

    def publish_payload(self, payload: bytes, *, send: bool = True) -> int:
        """Publish an encoded batch; returns its seq."""
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if send:
            with contextlib.suppress(zmq.Again):  # past the HWM: dropped, as vLLM's PUB drops
                self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        return seq

    async def _serve_replay(self) -> None:
        assert self.replay is not None
        while True:
            frames = await self.replay.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM logs and ignores a malformed request
            self.replay_requests += 1
            client, _, start_raw = frames
            start = int.from_bytes(start_raw, "big")
            for seq, buf in list(self.buffer):
                if seq >= start:
                    await self.replay.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), buf])
            await self.replay.send_multipart([client, b"", b"", END_SEQ_BYTES, b""])

    async def close(self) -> None:
        """Stop serving and close the sockets."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)
        self.ctx.term()
