"""The Responses surface's pre-warm request: instructions, the leading system/developer items and the first user
item (or a string input) with what vLLM renders, for one token, never stored."""

from __future__ import annotations

from app.surfaces import RESPONSES

TOOLS = [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]


def test_the_warm_request_is_instructions_leading_items_and_the_first_user_item_unstored_for_one_token() -> None:
    body = {
        "model": "m", "instructions": "You are Codex.", "tools": TOOLS, "reasoning": {"effort": "low"},
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox rules"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
        "stream": True, "previous_response_id": None, "temperature": 0.3,
    }  # fmt: skip
    warm = RESPONSES.warm_request(body, 10_000)
    assert warm is not None and warm.path == "/v1/responses"
    assert [item["role"] for item in warm.body["input"]] == ["developer", "user"]
    assert warm.body["instructions"] == "You are Codex." and warm.body["tools"] == TOOLS
    assert warm.body["reasoning"] == {"effort": "low"}
    assert warm.body["max_output_tokens"] == 1 and warm.body["stream"] is False and warm.body["store"] is False
    assert "temperature" not in warm.body and "model" not in warm.body


def test_a_string_input_is_its_own_first_user_message() -> None:
    warm = RESPONSES.warm_request({"instructions": "be brief", "input": "hello"}, 10_000)
    assert warm is not None and warm.body["input"] == "hello" and warm.body["instructions"] == "be brief"


def test_input_that_starts_with_a_tool_output_or_is_too_long_has_no_warm_request() -> None:
    first_output = {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}
    assert RESPONSES.warm_request(first_output, 10_000) is None
    assert RESPONSES.warm_request({"instructions": "x" * 500, "input": "y" * 10}, 505) is None
    assert RESPONSES.warm_request({"instructions": "x" * 500, "input": "y" * 10}, 510) is not None


def test_reply_usage_reads_input_and_cached_tokens() -> None:
    usage = RESPONSES.reply_usage({"usage": {"input_tokens": 50, "output_tokens": 1,
                                             "input_tokens_details": {"cached_tokens": 48}}})  # fmt: skip
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (50, 48, 1)


def test_the_warm_history_is_every_input_item_so_far_unstored_unless_it_continues_a_stored_response() -> None:
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    body = {"instructions": "You are Codex.", "tools": TOOLS, "input": items, "temperature": 0.3}
    history, prefix = RESPONSES.warm_history(body, 10_000), RESPONSES.warm_request(body, 10_000)
    assert history is not None and prefix is not None and history.path == "/v1/responses"
    assert history.body["input"] == items and history.body["store"] is False
    assert history.body["max_output_tokens"] == 1 and history.chars == prefix.chars + len("{}") + len("ok")
    assert RESPONSES.warm_history({**body, "previous_response_id": "resp_1"}, 10_000) is None
    assert RESPONSES.warm_history({**body, "input": "hello"}, 10_000) is None, "a string input is its prefix"
    assert RESPONSES.warm_history(body, history.chars - 1) is None
