"""The Messages surface's pre-warm request: system, tools and the first user message with what vLLM renders, for
one token; count_tokens has none and never streams; upstream errors in Anthropic's envelope."""

from __future__ import annotations

import orjson

from app.surfaces import COUNT_TOKENS, MESSAGES

TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]
SYSTEM = [{"type": "text", "text": "You are Claude Code."}]


def claude_code(**extra: object) -> dict[str, object]:
    return {
        "model": "m", "max_tokens": 32000, "system": SYSTEM, "tools": TOOLS, "stream": True,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                         {"type": "text", "text": "refactor it"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        ],
        **extra,
    }


def test_the_warm_request_is_system_tools_and_the_first_user_message_for_one_token() -> None:
    warm = MESSAGES.warm_request(claude_code(temperature=1), 10_000)
    assert warm is not None and warm.path == "/v1/messages"
    assert warm.body["system"] == SYSTEM and warm.body["tools"] == TOOLS
    assert len(warm.body["messages"]) == 1 and warm.body["messages"][0]["content"][1]["text"] == "refactor it"
    assert warm.body["max_tokens"] == 1 and warm.body["stream"] is False
    assert "temperature" not in warm.body and "model" not in warm.body


def test_thinking_is_kept_only_where_it_renders_and_never_with_a_budget_above_one_token() -> None:
    enabled = MESSAGES.warm_request(claude_code(thinking={"type": "enabled", "budget_tokens": 4096}), 10_000)
    disabled = MESSAGES.warm_request(claude_code(thinking={"type": "disabled"}), 10_000)
    effort = MESSAGES.warm_request(claude_code(output_config={"effort": "high", "format": None}), 10_000)
    assert enabled is not None and "thinking" not in enabled.body, "vLLM needs budget_tokens < max_tokens"
    assert disabled is not None and disabled.body["thinking"] == {"type": "disabled"}
    assert effort is not None and effort.body["output_config"] == {"effort": "high"}


def test_a_conversation_that_starts_with_the_assistant_or_is_too_long_has_no_warm_request() -> None:
    body = claude_code()
    assert MESSAGES.warm_request({**body, "messages": body["messages"][1:]}, 10_000) is None  # type: ignore[index]
    assert MESSAGES.warm_request(body, 40) is None


def test_count_tokens_has_no_warm_request() -> None:
    assert COUNT_TOKENS.warm_request(claude_code(), 10_000) is None


def test_count_tokens_asking_for_a_stream_is_sent_without_it_and_never_streamed() -> None:
    body = {k: v for k, v in claude_code().items() if k != "max_tokens"}
    parsed = COUNT_TOKENS.validate(body)
    assert "stream" not in body and parsed.stream is False  # the engine answers JSON: a stream waited for is none


def test_a_non_json_upstream_error_is_anthropics_envelope() -> None:
    for surface in (MESSAGES, COUNT_TOKENS):
        doc = orjson.loads(surface.upstream_error(400, b"<html>Bad Request</html>"))
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        assert isinstance(doc["error"]["message"], str)


def test_reply_usage_counts_cache_reads_into_the_prompt() -> None:
    usage = MESSAGES.reply_usage({"usage": {"input_tokens": 2, "cache_read_input_tokens": 48, "output_tokens": 1}})
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (50, 48, 1)


def test_the_warm_history_is_the_whole_conversation_with_what_the_prefix_renders() -> None:
    body = claude_code(thinking={"type": "disabled"}, temperature=1)
    history, prefix = MESSAGES.warm_history(body, 10_000), MESSAGES.warm_request(body, 10_000)
    assert history is not None and prefix is not None and history.path == "/v1/messages"
    assert history.body["messages"] == body["messages"] and history.chars > prefix.chars
    assert history.body["system"] == SYSTEM and history.body["tools"] == TOOLS
    assert history.body["thinking"] == {"type": "disabled"} and history.body["max_tokens"] == 1
    assert "temperature" not in history.body and history.body["stream"] is False
    assert MESSAGES.warm_history(body, history.chars - 1) is None, "over the cap"
    assert MESSAGES.warm_history({**body, "messages": body["messages"][:1]}, 10_000) is None  # type: ignore[index]
    assert COUNT_TOKENS.warm_history(body, 10_000) is None
