"""An in-process publisher that speaks vLLM 0.32's KV-event wire protocol (PUB + ROUTER replay), for tests.

It mirrors ZmqEventPublisher in vllm/distributed/kv_events.py: multipart ``[topic, seq, msgpack batch]``,
seq from 0 per process, a bounded replay buffer, replay replies ``[id, b"", topic, seq, payload]`` and the
end marker ``[id, b"", b"", -1, b""]``. Events are encoded from plain dicts, not from kvgate's structs.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from typing import Any

import msgspec
import zmq
import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stored(hashes: list[int], parent: int | None = None, medium: str | None = "GPU", block_size: int = 16) -> dict:
    """A BlockStored event as vLLM encodes it (map tagged by "type")."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(block_size * len(hashes))),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
    }


def removed(hashes: list[int], medium: str | None = "GPU") -> dict:
    """A BlockRemoved event."""
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def cleared() -> dict:
    """An AllBlocksCleared event."""
    return {"type": "AllBlocksCleared"}


class WirePublisher:
    """PUB (bind or connect) plus a ROUTER replay socket, with vLLM's sequence numbers and replay buffer."""

    def __init__(
        self, endpoint: str, replay: str | None, *, bind: bool = True, topic: str = "", buffer_steps: int = 10_000
    ) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if bind:
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
        self._task = asyncio.create_task(self._serve_replay()) if self.replay is not None else None

    def publish(self, events: list[dict[str, Any]], *, send: bool = True, ts: float | None = None) -> int:
        """Publish one batch (or only buffer it when send=False, to simulate a lost PUB frame); returns its seq."""
        seq = self.seq
        self.seq += 1
        payload = msgspec.msgpack.encode([time.time() if ts is None else ts, events, 0])
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def _serve_replay(self) -> None:
        assert self.replay is not None
        while True:
            frames = await self.replay.recv_multipart()
            if len(frames) != 3:
                continue
            self.replay_requests += 1
            client, _, start_raw = frames
            start = int.from_bytes(start_raw, "big")
            for seq, buf in list(self.buffer):
                if seq >= start:
                    await self.replay.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), buf])
            await self.replay.send_multipart([client, b"", b"", END_SEQ, b""])

    async def close(self) -> None:
        """Stop serving and close the sockets."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)
        self.ctx.term()
