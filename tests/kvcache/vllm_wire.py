"""An in-process publisher that speaks vLLM 0.32's KV-event wire protocol (PUB + ROUTER replay), for tests.

The socket side is app/kvcache/publisher.py (shared with the sim), which mirrors ZmqEventPublisher in
vllm/distributed/kv_events.py. Events here are plain dicts, not kvgate's structs, so the subscriber's decoder is
not tested against itself.
"""

from __future__ import annotations

from app.kvcache.publisher import END_SEQ_BYTES, KvEventPublisher
from kvlab.net import free_port as free_port  # re-exported

END_SEQ = END_SEQ_BYTES



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


class WirePublisher(KvEventPublisher):
    """app.kvcache.publisher's PUB + ROUTER replay, bound by default (tests pass concrete loopback endpoints)."""

    def __init__(
        self, endpoint: str, replay: str | None, *, bind: bool = True, topic: str = "", buffer_steps: int = 10_000
    ) -> None:
        super().__init__(endpoint, replay, topic=topic, buffer_steps=buffer_steps, bind=bind)
        self.start()
