"""Reply learning: the reply a client got is read back once sent and the next turn's prefix hashed ahead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from app.dispatch import Complete, StreamRelay
from app.kvcache.hashing import block_hashes
from app.kvcache.replies import ReplyLearner, assistant_message, continues
from app.kvcache.tokens import RequestBlocks
from app.records import PromptBlocks
from tests.surfaces.migration.test_chat import chunk, usage
from tests.test_dispatch import A, B, FakeResponse, ctx, setup

SMOLLM2 = Path.home() / ".cache/kvgate/models/smollm2-135m"
needs_model = pytest.mark.skipif(
    not (SMOLLM2 / "tokenizer.json").exists(), reason="SmolLM2 folder not converted (scripts/vllm-cpu.sh model)"
)
SYSTEM = "You are the build agent. " * 40  # longer than the prefix cache's key head
REPLY_BODY = orjson.dumps(
    {"id": "c1", "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
     "message": {"role": "assistant", "content": "All green.", "reasoning_content": None}}],
     "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
)  # fmt: skip


def body(*turns: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": messages}


def test_a_completion_gives_back_the_assistant_message_a_client_resends() -> None:
    doc = orjson.loads(REPLY_BODY)
    assert assistant_message(doc) == {"role": "assistant", "content": "All green."}
    calls = [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    doc["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
    assert assistant_message(doc) == {"role": "assistant", "content": None, "tool_calls": calls}
    assert assistant_message({"choices": [doc["choices"][0]] * 2}) is None  # n > 1: which one comes back?
    assert assistant_message({"choices": []}) is None


def test_only_bodies_continued_by_a_new_turn_are_learned() -> None:
    assert continues({"messages": []})
    assert not continues({"n": 2})
    assert not continues({"continue_final_message": True})
    assert not continues({"add_generation_prompt": False})


async def test_a_hashed_completion_can_be_read_back_after_it_was_sent() -> None:
    d, _, _ = setup({A: [FakeResponse(body=REPLY_BODY)], B: []})
    c = ctx()
    c.blocks = PromptBlocks(1, [])
    out = await d.run(c, d.cfg.models[0], 0)
    assert isinstance(out, Complete) and c.reply is not None
    assert c.reply() == {"role": "assistant", "content": "All green."}
    plain = ctx()  # not hashed: nothing kept for learning
    d2, _, _ = setup({A: [FakeResponse(body=REPLY_BODY)], B: []})
    await d2.run(plain, d2.cfg.models[0], 0)
    assert plain.reply is None


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([chunk(role=True), chunk("All "), chunk("green.", finish="stop"), usage(5, 2)], "All green."),
        ([chunk(role=True), chunk(tool=True), chunk(finish="tool_calls"), usage(5, 2)], None),
    ],
)
async def test_a_hashed_stream_is_read_back_without_migration(chunks: list[bytes], expected: str | None) -> None:
    d, _, _ = setup({A: [FakeResponse(chunks=[*chunks, b"data: [DONE]\n\n"])], B: []}, {"max_migrations": 0})
    c = ctx(stream=True)
    c.blocks = PromptBlocks(1, [])
    relay = await d.run(c, d.cfg.models[0], 0)
    assert isinstance(relay, StreamRelay) and c.reply is not None
    async for _ in relay.events():
        pass
    assert c.reply() == (None if expected is None else {"role": "assistant", "content": expected})


def learned_ctx(hasher: RequestBlocks, request: dict[str, Any], reply: str) -> Any:
    c = ctx()
    c.body, c.status, c.cache_salt = request, 200, "salt"
    c.blocks = hasher.blocks(request, "salt")
    c.reply = lambda: {"role": "assistant", "content": reply}
    return c


@needs_model
@pytest.mark.parametrize("inline_chars", [2048, 0])  # 0: every reply is tokenized on a worker thread
async def test_a_learned_reply_leaves_the_next_turn_only_its_user_message(inline_chars: int) -> None:
    hasher = RequestBlocks(SMOLLM2, block_size=16)
    learner = ReplyLearner({"m": hasher}, inline_chars=inline_chars)
    first = body("Build the project.")
    reply = "Built it: " + "the cache checked ok, " * 60
    await learner.learn(learned_ctx(hasher, first, reply))
    assert learner.learned == 1
    nxt = body("Build the project.", reply, "Now run the tests.")
    unseen = hasher.unseen_pieces(hasher.render(nxt), "salt")
    assert unseen == ["user\nNow run the tests."]
    cold = RequestBlocks(SMOLLM2, block_size=16)
    assert hasher.blocks(nxt, "salt").hashes == block_hashes(cold._whole(cold.render(nxt)), 16, cache_salt="salt")


@needs_model
async def test_replies_that_cannot_come_back_as_a_turn_are_not_learned() -> None:
    hasher = RequestBlocks(SMOLLM2, block_size=16)
    learner = ReplyLearner({"m": hasher})
    failed = learned_ctx(hasher, body("Build."), "x")
    failed.status = 502
    many = learned_ctx(hasher, {**body("Build."), "n": 2}, "x")
    tool_only = learned_ctx(hasher, body("Build."), "x")
    tool_only.reply = lambda: {"role": "assistant", "content": None}  # SmolLM2's template cannot render it
    for c in (failed, many, tool_only):
        await learner.learn(c)
    assert learner.learned == 0
