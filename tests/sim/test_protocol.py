"""Request validation answers what vLLM 0.32 answers (messages captured from a real server)."""

from __future__ import annotations

from typing import Any

import pytest

from app.sim.protocol import SimHTTPError, check_tool_choice, json_decode_error, parse_generation
from app.sim.tokenizer import FallbackTokenizer

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _parse(body: dict[str, Any], **kw: Any) -> Any:
    args: dict[str, Any] = {"tokenizer": FallbackTokenizer(), "served_model": "m", "max_model_len": 64,
                            "priority_enabled": False, "header_priority": None, "default_system": None}
    args.update(kw)
    return parse_generation("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}, **args)


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (None, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        ({"type": "function", "function": {"name": "f"}},
         'tool_choice=function "f" requires --tool-call-parser to be set'),
    ],
)
def test_tools_need_the_servers_tool_calling_flags(choice: object, message: str) -> None:
    body: dict[str, Any] = {"tools": TOOLS}
    if choice is not None:
        body["tool_choice"] = choice
    with pytest.raises(SimHTTPError) as e:
        check_tool_choice(body, auto_tool_choice=False, tool_parser=None)
    assert (e.value.status, e.value.message, e.value.err_type, e.value.param) == (400, message, "BadRequestError", None)
    check_tool_choice(body, auto_tool_choice=True, tool_parser="hermes")


def test_tool_choice_none_is_always_accepted() -> None:
    check_tool_choice({"tools": TOOLS, "tool_choice": "none"}, auto_tool_choice=False, tool_parser=None)


def test_max_tokens_is_clamped_to_the_room_left_but_refused_beyond_the_model_length() -> None:
    g = _parse({"max_tokens": 60})
    assert g.max_tokens == 64 - len(g.prompt_ids)
    with pytest.raises(SimHTTPError) as e:
        _parse({"max_tokens": 65})
    assert e.value.message == ("max_tokens=65 cannot be greater than max_model_len=64. Please request fewer "
                               "output tokens. (parameter=max_tokens, value=65)")


def test_a_prompt_longer_than_the_context_is_refused() -> None:
    with pytest.raises(SimHTTPError) as e:
        _parse({"messages": [{"role": "user", "content": "word " * 100}]})
    assert e.value.param == "input_tokens" and "maximum context length is 64 tokens" in e.value.message


def test_priority_is_ignored_under_fcfs_and_honoured_under_priority() -> None:
    assert _parse({"priority": 5}).priority == 0
    assert _parse({"priority": 5}, priority_enabled=True).priority == 5
    assert _parse({}, priority_enabled=True, header_priority="-3").priority == -3


def test_n_below_one_and_stream_options_without_stream_are_refused() -> None:
    with pytest.raises(SimHTTPError, match=r"n must be at least 1, got 0\."):
        _parse({"n": 0})
    with pytest.raises(SimHTTPError, match="Stream options can only be defined when `stream=True`"):
        _parse({"stream_options": {"include_usage": True}})


def test_malformed_json_gets_fastapis_validation_body() -> None:
    err = json_decode_error(b"{bad")
    assert err.param == "body.1" and err.err_type == "Bad Request"
    assert "'msg': 'JSON decode error'" in err.message
    assert "Expecting property name enclosed in double quotes" in err.message


def test_speculative_flag_parses_k_accept_and_optional_draft_share() -> None:
    from app.sim.options import SpecConfig

    assert SpecConfig.parse("ngram:3:0.7") == SpecConfig("ngram", 3, 0.7, 1.0)
    assert SpecConfig.parse("ngram:4:0.1:0.05") == SpecConfig("ngram", 4, 0.1, 0.05)
    for bad in ("ngram:0:0.5", "ngram:3:1.5", "ngram:3", "ngram:x:0.5", "ngram:3:0.5:2"):
        with pytest.raises(ValueError):
            SpecConfig.parse(bad)
