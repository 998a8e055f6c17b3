"""A Messages body becomes the chat request vLLM 0.32 makes of it (to_chat_completion_request)."""

from __future__ import annotations

from app.surfaces.messages.to_chat import chat_messages, chat_request


def test_system_blocks_drop_the_billing_line_and_blocks_become_chat_parts() -> None:
    body = {
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abcde;"},
                   {"type": "text", "text": "You are terse."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "AAA"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "ok"},
                                              {"type": "tool_use", "id": "tu1", "name": "ls", "input": {"d": "/"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1",
                                          "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
        ],
    }  # fmt: skip
    assert chat_messages(body) == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}]},
        {"role": "assistant", "reasoning": "hmm", "content": "ok",
         "tool_calls": [{"id": "tu1", "type": "function", "function": {"name": "ls", "arguments": '{"d": "/"}'}}]},
        {"role": "tool", "tool_call_id": "tu1", "content": "a\nb"},
    ]  # fmt: skip


def test_tools_choice_stops_and_sampling_map_to_chat_fields() -> None:
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2,
            "top_k": 5, "stop_sequences": ["END"], "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "tools": [{"name": "ls", "description": "list", "input_schema": {"properties": {}}}]}  # fmt: skip
    chat = chat_request(body)
    assert chat["stop"] == ["END"] and chat["temperature"] == 0.2 and chat["top_k"] == 5
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    schema = {"properties": {}, "type": "object"}  # vLLM's validator adds the type, last
    assert chat["tools"] == [{"type": "function", "function": {"name": "ls", "description": "list",
                                                               "parameters": schema, "strict": None,
                                                               "defer_loading": None}}]  # fmt: skip
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True} and chat["max_tokens"] == 9
    named = chat_request({**body, "tool_choice": {"type": "tool", "name": "ls"}})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "ls"}}
    assert chat_request({**body, "tool_choice": None})["tool_choice"] == "auto"  # tools without a choice: auto


def test_the_gateway_and_the_sim_convert_a_claude_code_conversation_alike() -> None:
    # Two copies on purpose (the sim is the test double, app/sim/messages.py says why); on text, tool use and tool
    # results, what Claude Code sends, they must not drift apart.
    from app.sim.messages import to_chat_messages

    body = {
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abcde;"},
                   {"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                         {"type": "text", "text": "list it"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                                              {"type": "tool_use", "id": "tu1", "name": "ls", "input": {"d": "/"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1",
                                          "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                                         {"type": "text", "text": "next"}]},
            {"role": "assistant", "content": "plain"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu2", "content": "str result"}]},
        ],
    }  # fmt: skip
    converted = chat_messages(body)
    assert converted == to_chat_messages(body)
    assert [m["role"] for m in converted] == ["system", "user", "assistant", "tool", "user", "assistant", "tool"]
