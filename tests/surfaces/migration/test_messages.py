"""Messages streams cut by their replica continue through another's chat endpoint, as one message to the client."""

from __future__ import annotations

from typing import Any

import orjson

from app.sim.messages_wire import MessageEvents
from app.surfaces import MESSAGES
from app.surfaces.messages.migration import MessagesSplice, anthropic_usage, delivered, not_migratable
from app.surfaces.sse import named_event
from tests.surfaces.migration.helpers import Migrated, cut_and_continued, named_events
from tests.surfaces.migration.test_chat import chunk, usage
from tests.test_dispatch import B

BODY: dict[str, Any] = {"model": "m", "max_tokens": 10, "stream": True, "system": "Be brief.",
                        "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip


def first_stream() -> list[bytes]:
    ev = MessageEvents("msg_a", "m", 11, details=False)
    return [ev.head(), ev.delta("Hello"), ev.delta(" wor")]


def first_events() -> list[bytes]:
    return [e + b"\n\n" for chunk in first_stream() for e in chunk.split(b"\n\n") if e]


CHAT_CONTINUATION = [chunk(role=True, rid="c2"), chunk("ld", rid="c2"), chunk("!", rid="c2", finish="length"),
                     usage(14, 2), b"data: [DONE]\n\n"]  # fmt: skip


async def migrated(body: dict[str, Any]) -> Migrated:
    return await cut_and_continued(MESSAGES, "/v1/messages", body, first_stream(), CHAT_CONTINUATION)


async def test_a_cut_message_stream_continues_in_the_same_text_block() -> None:
    events, c, _ = await migrated(dict(BODY))
    names = [n for n, _ in events]
    assert names == ["message_start", "content_block_start", *["content_block_delta"] * 4, "content_block_stop",
                     "message_delta", "message_stop"]  # fmt: skip
    assert events[0][1]["message"]["id"] == "msg_a"
    deltas = [d for n, d in events if n == "content_block_delta"]
    assert "".join(d["delta"]["text"] for d in deltas) == "Hello world!"  # nothing repeated, nothing missing
    assert {d["index"] for d in deltas} == {0} and events[6][1]["index"] == 0
    final = events[7][1]
    assert final["delta"]["stop_reason"] == "max_tokens"
    # The continuation's 14 prompt tokens held the 3 delivered ones: output 2 + 3, input 11 as at message_start.
    assert final["usage"] == {"input_tokens": 11, "output_tokens": 5}
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (11, 5)
    assert c.migrations == 1 and c.migration_outcomes == ["migrated"]


async def test_the_continuation_is_vllms_chat_request_with_the_delivered_text_as_an_open_turn() -> None:
    _, _, transport = await migrated(dict(BODY))
    replica, path, body = transport.requests[-1]
    assert (replica, path) == (B, "/v1/chat/completions")
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "Hello wor"}]  # fmt: skip
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 7 and body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_messages_that_cannot_continue_faithfully_say_why() -> None:
    got = delivered(first_events())
    assert not_migratable(BODY, got) is None and got.text == "Hello wor" and got.open_index == 0
    assert not_migratable({**BODY, "thinking": {"type": "enabled", "budget_tokens": 100}}, got) == "reasoning"
    assert not_migratable({**BODY, "thinking": {"type": "disabled"}}, got) is None
    tool = named_event("content_block_start", {"type": "content_block_start", "index": 1,
                                               "content_block": {"type": "tool_use", "id": "t", "name": "f"}})
    assert not_migratable(BODY, delivered([*first_events(), tool])) == "tool_call"
    think = named_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "thinking", "thinking": ""}})
    assert not_migratable(BODY, delivered([first_events()[0], think])) == "reasoning"
    stop = named_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}})
    assert not_migratable(BODY, delivered([*first_events(), stop])) == "finished"


def test_a_tool_call_in_the_continuation_becomes_a_tool_use_block_after_the_text() -> None:
    s = MessagesSplice(delivered(first_events()), 3)
    call = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"a":'}}
    tool = b"data: " + orjson.dumps({"id": "c2", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}) + b"\n\n"
    out = s.rewrite(tool) + s.rewrite(chunk(finish="tool_calls", rid="c2")) + s.rewrite(usage(14, 2))
    events = named_events(b"".join(out))
    assert [n for n, _ in events] == ["content_block_stop", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    assert events[0][1]["index"] == 0 and events[1][1]["index"] == 1
    assert events[1][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "f", "input": {}}
    assert events[2][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a":'}
    assert events[4][1]["delta"]["stop_reason"] == "tool_use"


def test_a_cut_after_a_closed_block_opens_the_next_index() -> None:
    stop = named_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    s = MessagesSplice(delivered([*first_events(), stop]), 3)
    events = named_events(b"".join(s.rewrite(chunk("x", rid="c2"))))
    assert [(n, d["index"]) for n, d in events] == [("content_block_start", 1), ("content_block_delta", 1)]


def test_chat_usage_becomes_anthropic_usage_with_the_delivered_tokens_as_output() -> None:
    details = {"prompt_tokens": 20, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}}
    assert anthropic_usage(details, 3) == {"input_tokens": 9, "output_tokens": 5, "cache_read_input_tokens": 8}
    assert anthropic_usage({"prompt_tokens": 20, "completion_tokens": 2}, 3) == {"input_tokens": 17,
                                                                                 "output_tokens": 5}  # fmt: skip


async def test_an_engine_error_in_the_continuation_ends_with_anthropics_error_event() -> None:
    s = MessagesSplice(delivered(first_events()), 3)
    out = s.rewrite(b'data: {"error":{"message":"boom","type":"InternalServerError","code":500}}\n\n')
    [(name, doc)] = named_events(b"".join(out))
    assert name == "error" and doc["error"] == {"type": "api_error", "message": "boom"}


def test_held_back_whitespace_the_continuation_writes_again_is_not_sent_twice() -> None:
    ev = MessageEvents("msg_a", "m", 11, details=False)
    journal = [e + b"\n\n" for part in (ev.head(), ev.delta("Colors:"), ev.delta("\n"), ev.delta("\n"))
               for e in part.split(b"\n\n") if e]  # fmt: skip
    got = delivered(journal)
    assert got.resume_text() == "Colors:" and got.held_back() == "\n\n"
    s = MessagesSplice(got, 2)
    out = s.rewrite(chunk("\n", rid="c2")) + s.rewrite(chunk("\n1.", rid="c2"))
    assert [d["delta"]["text"] for _, d in named_events(b"".join(out))] == ["1."]
