from app.routing.tpot.kind import request_kind


def test_a_fenced_block_in_the_last_user_turn_is_code() -> None:
    body = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "fix this\n```python\nx = 1\n```"}]}
    assert request_kind(body) == "code"


def test_a_unified_diff_in_content_parts_is_code() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "apply\n--- a/x.py\n+++ b/x.py"}]}]}
    assert request_kind(body) == "code"


def test_offered_tools_make_tool_arguments_unless_tool_choice_is_none() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert request_kind({"messages": [{"role": "user", "content": "hi"}], "tools": tools}) == "tool"
    assert request_kind({"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                         "tool_choice": "none"}) == "prose"


def test_code_in_an_earlier_turn_does_not_make_a_chat_reply_code() -> None:
    body = {"messages": [{"role": "user", "content": "```x```"}, {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": "thanks, and why is the sky blue?"}]}
    assert request_kind(body) == "prose"


def test_responses_and_completions_bodies_are_read_too() -> None:
    assert request_kind({"input": "```\ncode\n```"}) == "code"
    assert request_kind({"prompt": "Once upon a time"}) == "prose"
    assert request_kind({}) == "prose"
