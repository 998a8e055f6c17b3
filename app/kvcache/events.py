"""Wire decoding of vLLM 0.32's KV-cache events (vllm/distributed/kv_events.py).

A ZMQ message is ``[topic, seq (8 bytes, big-endian), msgpack EventBatch]``; the batch is the array
``[ts, events, data_parallel_rank]`` and each event a map tagged by ``"type"``: ``BlockStored``,
``BlockRemoved`` or ``AllBlocksCleared``. Unknown fields are ignored and unknown event types are skipped
(counted), so a newer vLLM that adds either does not blind the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from app.kvcache.hashing import to_event_hash

MEDIUM_GPU: Final = "GPU"
MEDIUM_CPU: Final = "CPU"
END_SEQ: Final = -1


class BlockStored(msgspec.Struct, tag=True, frozen=True):
    """Blocks that became cached on the replica, in chain order (the first one's parent is `parent_block_hash`)."""

    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[list[object] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, frozen=True):
    """Blocks evicted from `medium` (None means the GPU)."""

    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, frozen=True):
    """The replica dropped its whole prefix cache (reset_prefix_cache, sleep, restart of the cache)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded batch: publisher timestamp, events in order, DP rank, and how many events were unknown."""

    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None
    skipped: int = 0


class EventDecodeError(ValueError):
    """The payload is not a vLLM EventBatch."""


@dataclass(frozen=True, slots=True)
class EventDecoder:
    """Reusable msgpack decoders (msgspec decoders are built once and are safe to share read-only)."""

    batch: msgspec.msgpack.Decoder[_Batch]
    raw: msgspec.msgpack.Decoder[_RawBatch]
    one: msgspec.msgpack.Decoder[KvEvent]

    @classmethod
    def create(cls) -> EventDecoder:
        """Build the decoders."""
        return cls(
            msgspec.msgpack.Decoder(_Batch),
            msgspec.msgpack.Decoder(_RawBatch),
            msgspec.msgpack.Decoder(KvEvent),
        )

    def decode(self, payload: bytes) -> EventBatch:
        """Decode one EventBatch payload; raises EventDecodeError when it is not one."""
        try:
            b = self.batch.decode(payload)
            return EventBatch(b.ts, tuple(b.events), b.data_parallel_rank)
        except msgspec.ValidationError:
            pass  # an unknown event type or a changed field: decode event by event below
        except msgspec.DecodeError as exc:
            raise EventDecodeError(str(exc)) from exc
        try:
            raw = self.raw.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise EventDecodeError(str(exc)) from exc
        events: list[KvEvent] = []
        skipped = 0
        for item in raw.events:
            try:
                events.append(self.one.decode(item))
            except (msgspec.DecodeError, msgspec.ValidationError):
                skipped += 1
        return EventBatch(raw.ts, tuple(events), raw.data_parallel_rank, skipped)


def event_hash(h: int | bytes) -> int:
    """A block hash as an int: vLLM publishes ints by default, full digests when USE_INT_BLOCK_HASHES=0."""
    return h if isinstance(h, int) else to_event_hash(h)


def decode_seq(raw: bytes) -> int:
    """The 8-byte big-endian sequence number of a frame (the replay end marker is -1)."""
    return int.from_bytes(raw, "big", signed=True)


def encode_seq(seq: int) -> bytes:
    """Sequence number as vLLM sends it (also how a replay request names its start)."""
    return seq.to_bytes(8, "big", signed=True)
