"""One workload body, three APIs: the prompt carried over, usage read from each API's own fields."""

from __future__ import annotations

import pytest

from app.bench.apis import STREAM_READERS, apply_usage, to_body, whole_text
from app.bench.spec import RequestRecord
from tests.sim.shapes import real, real_events

CHAT = {
    "model": "m", "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
    "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
                 {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
    "tool_choice": "none",
}


def _rec() -> RequestRecord:
    return RequestRecord(index=0, session=0, turn=0, tenant=0, route_class="interactive")


def test_responses_body_moves_system_to_instructions_and_keeps_extra_fields() -> None:
    body = to_body("responses", CHAT)
    assert body["instructions"] == "S" and body["max_output_tokens"] == 7 and body["ignore_eos"] is True
    assert [m["role"] for m in body["input"]] == ["user", "assistant", "user"]
    assert body["tools"] == [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}]
    assert body["tool_choice"] == "none" and "stream_options" not in body and "messages" not in body


def test_messages_body_has_system_max_tokens_and_anthropic_tools() -> None:
    body = to_body("messages", CHAT)
    assert body["system"] == "S" and body["max_tokens"] == 7 and body["stream"] is True
    assert [m["content"] for m in body["messages"]] == ["u1", "a1", "u2"]
    assert body["tools"] == [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]
    assert body["tool_choice"] == {"type": "none"}
    assert to_body("chat", CHAT) is CHAT
    with pytest.raises(ValueError, match="unknown api"):
        to_body("grpc", CHAT)


def test_messages_prompt_is_input_plus_cache_read_and_written() -> None:
    rec = _rec()
    apply_usage("messages", rec, {"input_tokens": 34, "output_tokens": 2, "cache_creation_input_tokens": 128,
                                  "cache_read_input_tokens": 256})
    assert (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens) == (418, 256, 2)


def test_whole_bodies_captured_from_vllm_give_text_and_usage() -> None:
    rec = _rec()
    assert whole_text("responses", real("resp_cached_2.json"), rec)
    assert (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens) == (418, 384, 2)
    rec = _rec()
    assert whole_text("messages", real("msg_cached_2.json"), rec)
    assert (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens) == (418, 384, 2)


@pytest.mark.parametrize(("api", "fixture"), [("responses", "resp_stream.txt"), ("messages", "msg_stream.txt")])
def test_stream_events_captured_from_vllm_give_three_tokens_then_done(api: str, fixture: str) -> None:
    rec, read = _rec(), STREAM_READERS[api]
    steps = [read(data, rec) for _name, data in real_events(fixture)]
    texts = [t for t, _done, _err in steps if t is not None]
    assert len(texts) == 3 and all(texts)
    assert [done for _t, done, _e in steps].index(True) == len(steps) - 1
    assert all(err is None for _t, _d, err in steps)
    assert rec.usage_reported and (rec.prompt_tokens, rec.output_tokens) == (33, 3)


def test_error_events_fail_the_stream() -> None:
    rec = _rec()
    assert STREAM_READERS["messages"]({"type": "error", "error": {"type": "x", "message": "boom"}}, rec)[2] == "boom"
    assert STREAM_READERS["responses"]({"type": "error", "message": "bad", "sequence_number": 3}, rec)[2] == "bad"


def test_cli_api_flag_reaches_the_spec() -> None:
    import argparse

    from app.bench.cli import configure_parser, spec_from_args

    p = argparse.ArgumentParser()
    configure_parser(p)
    assert spec_from_args(p.parse_args(["--base-url", "http://h", "--api", "messages"])).api == "messages"
    assert spec_from_args(p.parse_args(["--base-url", "http://h"])).api == "chat"
    with pytest.raises(SystemExit):
        p.parse_args(["--base-url", "http://h", "--api", "grpc"])
