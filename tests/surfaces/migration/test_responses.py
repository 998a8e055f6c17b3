"""Responses streams cut by their replica continue on another's /v1/responses, as one response to the client."""

from __future__ import annotations

from typing import Any

from app.dispatch import StreamRelay
from app.sim.responses_wire import ResponseEvents, ResponseShape
from app.sim.surface import Usage
from app.surfaces import RESPONSES
from app.surfaces.responses.migration import ResponsesSplice, continuation, delivered, not_migratable
from app.surfaces.sse import named_event
from tests.surfaces.migration.helpers import Migrated, collect, cut_and_continued, named_events, surface_ctx
from tests.test_dispatch import A, B, FakeResponse, setup

BODY: dict[str, Any] = {"model": "m", "input": "hi", "stream": True, "max_output_tokens": 10}


def first_stream() -> list[bytes]:
    ev = ResponseEvents(ResponseShape(rid="resp_a", created=100, model="m", max_output_tokens=10))
    return [ev.head(), ev.delta("Hello"), ev.delta(" wor")]


def first_events() -> list[bytes]:
    """The first stream as the relay journals it: one SSE event each."""
    return [e + b"\n\n" for chunk in first_stream() for e in chunk.split(b"\n\n") if e]


def continuation_stream(usage: Usage) -> list[bytes]:
    ev = ResponseEvents(ResponseShape(rid="resp_b", created=200, model="m", max_output_tokens=7))
    return [ev.head(), ev.delta("ld"), ev.delta("!"), ev.tail("length", usage)]


async def migrated(body: dict[str, Any]) -> Migrated:
    second = continuation_stream(Usage(20, 2, 4, 0))
    return await cut_and_continued(RESPONSES, "/v1/responses", body, first_stream(), second)


async def test_a_cut_response_stream_continues_as_one_response_with_one_item() -> None:
    events, c, _ = await migrated(dict(BODY))
    names = [n for n, _ in events]
    assert names.count("response.created") == 1 and names.count("response.in_progress") == 1
    assert names.count("response.output_item.added") == 1 and names.count("response.content_part.added") == 1
    assert "error" not in names and names[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))  # one numbering, no gap
    item_id = next(d["item"]["id"] for n, d in events if n == "response.output_item.added")
    deltas = [d for n, d in events if n == "response.output_text.delta"]
    assert "".join(d["delta"] for d in deltas) == "Hello world!"  # nothing repeated, nothing missing
    assert {(d["item_id"], d["output_index"], d["content_index"]) for d in deltas} == {(item_id, 0, 0)}
    done = dict(events)
    assert done["response.output_text.done"]["text"] == "Hello world!"
    assert done["response.content_part.done"]["part"]["text"] == "Hello world!"
    assert done["response.output_item.done"]["item"]["id"] == item_id
    assert done["response.output_item.done"]["item"]["content"][0]["text"] == "Hello world!"
    final = done["response.completed"]["response"]
    assert final["id"] == "resp_a" and final["created_at"] == 100 and final["max_output_tokens"] == 10
    assert [(i["id"], i["content"][0]["text"]) for i in final["output"]] == [(item_id, "Hello world!")]
    # The continuation's 20 input tokens held the 3 delivered ones: output 2 + 3, input 17.
    assert final["usage"]["input_tokens"] == 17 and final["usage"]["output_tokens"] == 5
    assert final["usage"]["total_tokens"] == 22 and final["usage"]["input_tokens_details"]["cached_tokens"] == 4
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.cached_tokens) == (17, 5, 4)
    assert c.migrations == 1 and c.migration_outcomes == ["migrated"] and c.response_id == "resp_a"


async def test_the_continuation_is_the_request_with_the_delivered_text_as_an_in_progress_message() -> None:
    _, _, transport = await migrated(dict(BODY))
    replica, path, body = transport.requests[-1]
    assert (replica, path) == (B, "/v1/responses")
    assert body["input"][0] == {"role": "user", "content": "hi"}
    partial = body["input"][-1]
    assert partial["role"] == "assistant" and partial["type"] == "message" and partial["status"] == "in_progress"
    assert partial["content"][0]["text"] == "Hello wor" and body["max_output_tokens"] == 7


def test_a_client_item_list_keeps_its_items_and_gains_the_partial_message() -> None:
    items = [{"role": "developer", "content": "d"}, {"role": "user", "content": [{"type": "input_text", "text": "q"}]}]
    got = delivered(first_events())
    body = continuation({"input": items}, got, 3)
    assert body["input"][:2] == items and body["input"][2]["content"][0]["text"] == "Hello wor"
    assert "max_output_tokens" not in body


def event(name: str, doc: dict[str, Any]) -> bytes:
    return named_event(name, {"type": name, **doc})


def test_responses_that_cannot_continue_faithfully_say_why() -> None:
    got = delivered(first_events())
    assert not_migratable(BODY, got) is None
    assert not_migratable({**BODY, "top_logprobs": 2}, got) == "logprobs"
    assert not_migratable({**BODY, "include": ["message.output_text.logprobs"]}, got) == "logprobs"
    assert not_migratable({**BODY, "previous_response_id": "resp_x"}, got) == "pinned"
    call = event("response.output_item.added", {"item": {"type": "function_call", "id": "fc_1"}, "output_index": 0})
    assert not_migratable(BODY, delivered([first_events()[0], call])) == "tool_call"
    think = event("response.output_item.added", {"item": {"type": "reasoning", "id": "rs_1"}, "output_index": 0})
    assert not_migratable(BODY, delivered([first_events()[0], think])) == "reasoning"
    done = event("response.output_text.done", {"item_id": "m", "text": "x"})
    assert not_migratable(BODY, delivered([*first_events(), done])) == "finished"


async def test_a_response_asking_for_logprobs_ends_with_the_error_event_and_counts_it() -> None:
    d, _, _ = setup({A: [FakeResponse(chunks=first_stream(), fail_after=3)], B: []})
    c = surface_ctx(RESPONSES, "/v1/responses", {**BODY, "top_logprobs": 1})
    relay = await d.run(c, d.cfg.models[0], 0)
    assert isinstance(relay, StreamRelay)
    events = named_events(await collect(relay))
    assert events[-1][0] == "error" and c.migration_outcomes == ["logprobs"] and c.migrations == 0
    assert c.usage.completion_tokens == 2 and c.usage_estimated  # billed for the two deltas delivered


def test_held_back_whitespace_is_dropped_from_the_deltas_and_the_done_text_is_whole() -> None:
    ev = ResponseEvents(ResponseShape(rid="resp_a", created=100, model="m", max_output_tokens=10))
    journal = [e + b"\n\n" for part in (ev.head(), ev.delta("Colors:"), ev.delta("\n\n"))
               for e in part.split(b"\n\n") if e]  # fmt: skip
    got = delivered(journal)
    assert continuation(BODY, got, 2)["input"][-1]["content"][0]["text"] == "Colors:"
    cont = ResponseEvents(ResponseShape(rid="resp_b", created=200, model="m", max_output_tokens=8))
    raw = cont.head() + cont.delta("\n") + cont.delta("\n1. Red") + cont.tail("length", Usage(9, 3, 0, 0))
    s = ResponsesSplice(got, 2)
    events = named_events(b"".join(e for part in raw.split(b"\n\n") if part for e in s.rewrite(part + b"\n\n")))
    assert [d["delta"] for n, d in events if n == "response.output_text.delta"] == ["1. Red"]
    assert dict(events)["response.output_text.done"]["text"] == "Colors:\n\n1. Red"
    assert dict(events)["response.completed"]["response"]["output"][0]["content"][0]["text"] == "Colors:\n\n1. Red"
