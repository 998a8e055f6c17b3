"""Decoding vLLM's EventBatch bytes, as encoded by vLLM's own msgspec structs (fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from app.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    EventDecoder,
    decode_seq,
    encode_seq,
    event_hash,
)

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "vllm_vectors.json").read_text())["events"]
BATCHES = [bytes.fromhex(h) for h in FIXTURE["batches_hex"]]


def test_vllm_batch_decodes_to_typed_events_in_order() -> None:
    batch = EventDecoder.create().decode(BATCHES[0])
    assert batch.ts == 1764580000.25
    assert batch.data_parallel_rank == 0
    stored, stored_cpu, removed, cleared = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [11, 2**64 - 1]
    assert stored.parent_block_hash is None
    assert stored.token_ids == list(range(32))
    assert (stored.block_size, stored.medium) == (16, "GPU")
    assert isinstance(stored_cpu, BlockStored)
    assert (stored_cpu.medium, stored_cpu.lora_name, stored_cpu.parent_block_hash) == ("CPU", "ad1", 2**64 - 1)
    assert stored_cpu.extra_keys == [["ad1", "tenant-acme"]]
    assert isinstance(removed, BlockRemoved)
    assert (removed.block_hashes, removed.medium) == ([11], "GPU")
    assert isinstance(cleared, AllBlocksCleared)


def test_batch_without_rank_and_null_medium_decodes() -> None:
    batch = EventDecoder.create().decode(BATCHES[1])
    assert batch.data_parallel_rank is None
    assert batch.events == (BlockRemoved(block_hashes=[12], medium=None),)


def test_bytes_hashes_become_the_published_int_form() -> None:
    batch = EventDecoder.create().decode(BATCHES[2])
    stored = batch.events[0]
    assert isinstance(stored, BlockStored)
    assert event_hash(stored.block_hashes[0]) == int.from_bytes(b"\x01" * 8, "big")


def test_unknown_event_type_is_skipped_and_counted() -> None:
    payload = msgspec.msgpack.encode(
        [1.0, [{"type": "BlockPinned", "x": 1}, {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"}], 0]
    )
    batch = EventDecoder.create().decode(payload)
    assert batch.skipped == 1
    assert batch.events == (BlockRemoved(block_hashes=[5], medium="GPU"),)


def test_unknown_fields_are_ignored() -> None:
    payload = msgspec.msgpack.encode([1.0, [{"type": "AllBlocksCleared", "future": [1, 2]}]])
    assert EventDecoder.create().decode(payload).events == (AllBlocksCleared(),)


@pytest.mark.parametrize("payload", [b"\xc1", msgspec.msgpack.encode({"ts": 1}), msgspec.msgpack.encode([1.0, 5])])
def test_garbage_payload_raises_decode_error(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        EventDecoder.create().decode(payload)


def test_sequence_numbers_round_trip_and_end_marker_is_minus_one() -> None:
    assert decode_seq(encode_seq(123456789)) == 123456789
    assert decode_seq((-1).to_bytes(8, "big", signed=True)) == -1
    assert decode_seq((7).to_bytes(8, "big")) == 7
