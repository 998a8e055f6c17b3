"""The chat surface's pre-warm request: the leading system/developer messages, the tools and the first user
message, with what the template reads, for one token."""

from __future__ import annotations

from typing import Any

import orjson

from app.surfaces import CHAT

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def chat(*messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages], **extra}


def test_the_warm_request_is_the_leading_system_messages_tools_and_first_user_message_for_one_token() -> None:
    body = chat(("system", "rules"), ("developer", "more rules"), ("user", "task 1"), ("assistant", "done"),
                ("user", "task 2"), tools=TOOLS, tool_choice="none", temperature=0.2, stream=True)  # fmt: skip
    warm = CHAT.warm_request(body, 10_000)
    assert warm is not None and warm.path == "/v1/chat/completions"
    assert [m["content"] for m in warm.body["messages"]] == ["rules", "more rules", "task 1"]
    assert warm.body["tools"] == TOOLS and warm.body["tool_choice"] == "none"
    assert warm.body["max_tokens"] == 1 and warm.body["stream"] is False
    assert "temperature" not in warm.body and "model" not in warm.body


def test_a_prompt_without_a_leading_user_message_has_no_warm_request() -> None:
    assert CHAT.warm_request(chat(("system", "rules")), 10_000) is None
    assert CHAT.warm_request(chat(("assistant", "hi"), ("user", "x")), 10_000) is None
    assert CHAT.warm_request({"messages": "not a list"}, 10_000) is None


def test_a_prefix_longer_than_max_chars_has_no_warm_request() -> None:
    body = chat(("system", "x" * 900), ("user", "y" * 50), tools=TOOLS)
    assert CHAT.warm_request(body, 2_000) is not None
    assert CHAT.warm_request(body, 960) is None, "tools count toward the size"


def test_reply_usage_reads_prompt_and_cached_tokens() -> None:
    usage = CHAT.reply_usage({"usage": {"prompt_tokens": 40, "completion_tokens": 1,
                                        "prompt_tokens_details": {"cached_tokens": 32}}})  # fmt: skip
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (40, 32, 1)


def test_the_warm_history_is_every_message_so_far_with_what_the_template_reads() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}]
    body = chat(("system", "rules"), ("user", "task 1"), tools=TOOLS, tool_choice="none", temperature=0.2)
    body["messages"] += [{"role": "assistant", "content": None, "tool_calls": calls},
                         {"role": "tool", "tool_call_id": "c1", "content": "result"}]  # fmt: skip
    history, prefix = CHAT.warm_history(body, 10_000), CHAT.warm_request(body, 10_000)
    assert history is not None and prefix is not None and history.path == "/v1/chat/completions"
    assert history.body["messages"] == body["messages"] and history.body["messages"] is not body["messages"]
    assert history.body["tools"] == TOOLS and history.body["max_tokens"] == 1 and "temperature" not in history.body
    assert history.chars == prefix.chars + len("result") + len(orjson.dumps(calls))
    assert CHAT.warm_history(body, history.chars - 1) is None, "over the cap"
    assert CHAT.warm_history(chat(("assistant", "hi"), ("user", "x")), 10_000) is None, "no stable prefix"
