"""Mid-stream migration of chat streams: a stream cut by its replica continues on another, spliced in."""

from __future__ import annotations

from typing import Any

import orjson

from app.dispatch import StreamRelay
from app.surfaces.chat.migration import Splice, continuation, delivered, not_migratable
from tests.test_dispatch import A, B, FakeResponse, ctx, replica, setup


def chunk(content: str | None = None, *, role: bool = False, finish: str | None = None, rid: str = "c1",
          created: int = 100, tool: bool = False) -> bytes:  # fmt: skip
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
        delta["content"] = ""
    if content is not None:
        delta["content"] = content
    if tool:
        delta["tool_calls"] = [{"index": 0, "function": {"name": "f", "arguments": "{"}}]
    doc = {"id": rid, "created": created, "model": "m", "choices": [{"index": 0, "delta": delta,
                                                                     "finish_reason": finish}]}  # fmt: skip
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def usage(prompt: int, completion: int, rid: str = "c2", created: int = 200) -> bytes:
    doc = {"id": rid, "created": created, "model": "m", "choices": [],
           "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}
    return b"data: " + orjson.dumps(doc) + b"\n\n"


FIRST = [chunk(role=True), chunk("Hello"), chunk(" wor")]
SECOND = [chunk(role=True, rid="c2", created=200), chunk("ld", rid="c2", created=200),
          chunk("!", rid="c2", created=200, finish="stop"), usage(14, 2), b"data: [DONE]\n\n"]  # fmt: skip
TOKENIZE = b'{"count":3,"max_model_len":2048,"tokens":[1,2,3]}'


async def collect(relay: StreamRelay) -> bytes:
    return b"".join([c async for c in relay.events()])


async def test_a_stream_cut_midway_continues_on_another_replica_as_one_stream() -> None:
    d, cluster, _ = setup({A: [FakeResponse(chunks=FIRST, fail_after=3)],
                           B: [FakeResponse(body=TOKENIZE), FakeResponse(chunks=SECOND)]})  # fmt: skip
    c = ctx(stream=True)
    c.client_wants_usage = True
    relay = await d.run(c, d.cfg.models[0], 0)
    assert isinstance(relay, StreamRelay)
    out = await collect(relay)
    events = [orjson.loads(line[6:]) for line in out.split(b"\n\n") if line.startswith(b"data: {")]
    text = "".join(ch["delta"].get("content") or "" for e in events for ch in e["choices"])
    assert text == "Hello world!"  # continued, nothing repeated or missing
    assert {e["id"] for e in events} == {"c1"} and {e["created"] for e in events} == {100}
    assert sum(1 for e in events for ch in e["choices"] if ch["delta"].get("role")) == 1  # one role chunk
    assert b'"error"' not in out
    assert events[-1]["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    assert c.usage.prompt_tokens == 11 and c.usage.completion_tokens == 5
    assert c.migrations == 1 and c.migration_outcomes == ["migrated"]
    assert c.route is not None and c.route.replica == B and c.route.reason == "migration"
    a, b = replica(cluster, A), replica(cluster, B)
    assert a.last_error == "protocol" and (a.in_flight, b.in_flight) == (0, 0)


async def test_the_continuation_carries_the_delivered_text_as_a_partial_assistant_turn() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    cont = continuation(body, "Hello wor", 3)
    assert cont["messages"][-1] == {"role": "assistant", "content": "Hello wor"}
    assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
    assert cont["max_tokens"] == 7 and body["max_tokens"] == 10
    prefilled = {**body, "messages": [*body["messages"], {"role": "assistant", "content": "Sure: "}]}
    assert continuation(prefilled, "x", 1)["messages"][-1]["content"] == "Sure: x"


def test_streams_that_cannot_continue_faithfully_say_why() -> None:
    base = {"messages": []}
    got = delivered([chunk("a")])
    assert not_migratable(base, got) is None
    assert not_migratable({"n": 2}, got) == "n"
    assert not_migratable({"logprobs": True}, got) == "logprobs"
    assert not_migratable(base, delivered([chunk(tool=True)])) == "tool_call"
    assert not_migratable(base, delivered([chunk("a", finish="stop")])) == "finished"


async def test_a_stream_asking_for_logprobs_is_not_migrated_and_ends_with_an_error_event() -> None:
    d, _, _ = setup({A: [FakeResponse(chunks=FIRST, fail_after=3)], B: []})
    c = ctx(stream=True)
    c.body["logprobs"] = True
    relay = await d.run(c, d.cfg.models[0], 0)
    assert isinstance(relay, StreamRelay)
    out = await collect(relay)
    assert b'"error"' in out and c.migration_outcomes == ["logprobs"] and c.migrations == 0


async def test_a_cut_stream_that_is_not_migrated_is_billed_for_what_was_delivered() -> None:
    d, _, _ = setup({A: [FakeResponse(chunks=FIRST, fail_after=3)]}, upstream={"max_migrations": 0})
    c = ctx(stream=True)
    c.estimated_input_tokens = 9
    relay = await d.run(c, d.cfg.models[0], 0)
    assert isinstance(relay, StreamRelay)
    await collect(relay)
    assert c.usage.reported and c.usage_estimated
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (9, 2)


async def test_when_no_other_replica_takes_it_the_stream_ends_with_an_error_event() -> None:
    refused = [FakeResponse(body=TOKENIZE), FakeResponse(status=503, body=b"{}")]
    d, _, _ = setup({A: [FakeResponse(chunks=FIRST, fail_after=3)], B: refused})
    c = ctx(stream=True)
    relay = await d.run(c, d.cfg.models[0], 0)
    assert isinstance(relay, StreamRelay)
    out = await collect(relay)
    assert b'"error"' in out and c.migration_outcomes == ["refused"]


def test_the_splice_keeps_the_original_identity_and_sums_usage() -> None:
    s = Splice("c1", 100, sent_tokens=4)
    assert s.rewrite(chunk(role=True, rid="c9", created=7)) == []
    [out] = s.rewrite(chunk("x", rid="c9", created=7))
    assert b'"id":"c1"' in out and b'"created":100' in out
    [summed] = s.rewrite(usage(20, 3, rid="c9", created=7))
    assert orjson.loads(summed[6:])["usage"]["prompt_tokens"] == 16
    assert orjson.loads(summed[6:])["usage"]["completion_tokens"] == 7


async def test_trailing_whitespace_is_held_back_and_not_sent_twice() -> None:
    # "\n", "\n" as the model wrote them would re-tokenize as one "\n\n": the continuation gets the text up to
    # the last word and writes the newlines again; the client, who has them, does not get them twice.
    first = [chunk(role=True), chunk("Colors:"), chunk("\n"), chunk("\n")]
    second = [chunk(role=True, rid="c2"), chunk("\n\n", rid="c2"), chunk("1. Red", rid="c2", finish="length"),
              usage(14, 3), b"data: [DONE]\n\n"]  # fmt: skip
    d, _, _ = setup({A: [FakeResponse(chunks=first, fail_after=4)],
                     B: [FakeResponse(body=TOKENIZE), FakeResponse(chunks=second)]})  # fmt: skip
    c = ctx(stream=True)
    relay = await d.run(c, d.cfg.models[0], 0)
    assert isinstance(relay, StreamRelay)
    out = await collect(relay)
    events = [orjson.loads(line[6:]) for line in out.split(b"\n\n") if line.startswith(b"data: {")]
    assert "".join(ch["delta"].get("content") or "" for e in events for ch in e["choices"]) == "Colors:\n\n1. Red"
