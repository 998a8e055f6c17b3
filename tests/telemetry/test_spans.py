"""Span attribute builders: request parameters, replica address, opt-in message capture."""

from __future__ import annotations

import orjson

from app.telemetry import spans as sp
from tests.telemetry.helpers import SECRET_PROMPT, make_ctx


def test_replica_address_defaults_the_port_by_scheme() -> None:
    assert sp.replica_address("http://10.0.0.5:8001") == ("10.0.0.5", 8001)
    assert sp.replica_address("https://vllm.internal") == ("vllm.internal", 443)
    assert sp.replica_address("http://vllm.internal/base") == ("vllm.internal", 80)


def test_start_attributes_take_max_completion_tokens_and_skip_non_numbers() -> None:
    ctx = make_ctx()
    ctx.body = {"max_completion_tokens": 99, "max_tokens": 5, "temperature": True, "top_p": "0.5"}
    attrs = sp.client_start_attributes(ctx, "served", ("h", 1))
    assert attrs[sp.REQUEST_MAX_TOKENS] == 99
    assert sp.REQUEST_TEMPERATURE not in attrs
    assert sp.REQUEST_TOP_P not in attrs


def test_error_type_prefers_the_pipeline_class_then_the_status() -> None:
    assert sp.error_type(make_ctx()) is None
    assert sp.error_type(make_ctx(status=504)) == "504"
    assert sp.error_type(make_ctx(status=502, error_type="timeout")) == "timeout"


def test_input_messages_are_role_and_parts_without_media_payloads() -> None:
    ctx = make_ctx(capture_content=True)
    ctx.body["messages"].append(
        {"role": "user", "content": [{"type": "text", "text": "see"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
    )
    ctx.body["messages"].append(
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    )
    ctx.body["messages"].append({"role": "tool", "tool_call_id": "c1", "content": "42"})
    messages = orjson.loads(sp.input_messages(ctx))
    system_text = f"You are helpful. {SECRET_PROMPT}"
    assert messages[0] == {"role": "system", "parts": [{"type": "text", "content": system_text}]}
    assert messages[2]["parts"] == [{"type": "text", "content": "see"}, {"type": "image_url"}]
    assert "base64" not in sp.input_messages(ctx)
    assert messages[3]["parts"] == [{"type": "tool_call", "id": "c1", "name": "f", "arguments": "{}"}]
    assert messages[4]["parts"] == [{"type": "tool_call_response", "id": "c1", "response": "42"}]


def test_gateway_attributes_list_moved_rules_with_counts() -> None:
    attrs = sp.gateway_attributes(make_ctx())
    assert attrs[sp.KV_NORMALIZE_RULES] == ["iso_timestamp:2", "uuid:1"]
    assert attrs[sp.KV_NORMALIZE_APPLIED] is True
