"""The sim's /v1/messages and count_tokens answer as vLLM 0.32 does, through the anthropic SDK."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest

from app.sim.testing import running_sim
from tests.sim.shapes import parse_events, real, real_events, shape

MODEL = "smollm2-135m"
HI = [{"role": "user", "content": "Say hi."}]
LONG = "The quick brown fox jumps over the lazy dog. " * 40


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with running_sim(model=MODEL, profile="cpu-smollm2", time_scale=100.0) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)


def test_create_through_the_sdk_stops_at_max_tokens(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=MODEL, messages=HI, max_tokens=4, extra_body={"ignore_eos": True})  # type: ignore[arg-type]
    assert m.id.startswith("chatcmpl-") and m.type == "message" and m.role == "assistant"
    assert m.stop_reason == "max_tokens" and m.content[0].type == "text" and m.content[0].text
    assert m.usage.output_tokens == 4 and m.usage.cache_read_input_tokens == 0


def test_whole_body_has_real_vllm_keys_in_order(base: str) -> None:
    got = httpx.post(base + "/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 4}).json()
    assert shape(got) == shape(real("msg_whole.json"))


def test_stream_through_the_sdk_yields_the_text_and_final_usage(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, messages=HI, max_tokens=3, extra_body={"ignore_eos": True}) as s:  # type: ignore[arg-type]
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3


def test_stream_events_are_the_real_sequence_with_real_keys(base: str) -> None:
    body = {"model": MODEL, "messages": HI, "max_tokens": 3, "stream": True, "ignore_eos": True}
    got = parse_events(httpx.post(base + "/v1/messages", json=body).text)
    assert [(n, shape(d)) for n, d in got] == [(n, shape(d)) for n, d in real_events("msg_stream.txt")]


def test_count_tokens_is_the_prompt_the_stream_reports(client: anthropic.Anthropic, base: str) -> None:
    counted = client.messages.count_tokens(model=MODEL, messages=HI)  # type: ignore[arg-type]
    body = {"model": MODEL, "messages": HI, "max_tokens": 1, "stream": True}
    start = parse_events(httpx.post(base + "/v1/messages", json=body).text)[0][1]
    assert counted.input_tokens == start["message"]["usage"]["input_tokens"] > 0
    raw = httpx.post(base + "/v1/messages/count_tokens", json={"model": MODEL, "messages": HI}).json()
    assert shape(raw) == shape(real("msg_count.json"))


def test_a_changing_billing_header_still_reads_the_cache(client: anthropic.Anthropic) -> None:
    def ask(nonce: str) -> anthropic.types.Usage:
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=1; cch={nonce};"},
                  {"type": "text", "text": LONG}]
        return client.messages.create(model=MODEL, system=system, messages=HI, max_tokens=2).usage  # type: ignore[arg-type]

    first, again = ask("4f8a2"), ask("91bc0")
    assert (first.cache_read_input_tokens, again.cache_creation_input_tokens) == (0, 0)
    assert first.cache_creation_input_tokens == again.cache_read_input_tokens >= 256
    # Anthropic's split: input_tokens excludes what the cache read or wrote.
    assert again.input_tokens == first.input_tokens
    with client.messages.stream(model=MODEL, system=[{"type": "text", "text": LONG}], messages=HI,  # type: ignore[arg-type]
                                max_tokens=2) as s:
        streamed = s.get_final_message().usage
    assert streamed.cache_read_input_tokens == again.cache_read_input_tokens


@pytest.mark.parametrize(
    ("body", "fixture"),
    [
        ({"model": MODEL, "messages": HI}, "msg_missing_max.json"),
        ({"model": MODEL, "messages": HI, "max_tokens": 0}, "msg_zero_max.json"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}], "max_tokens": 3}, "msg_bad_content.json"),
    ],
)
def test_invalid_bodies_get_vllms_validation_error(base: str, body: dict[str, object], fixture: str) -> None:
    r = httpx.post(base + "/v1/messages", json=body)
    assert r.status_code == 400 and r.json() == real(fixture)


def test_unknown_model_is_a_not_found_error_in_the_anthropic_envelope(client: anthropic.Anthropic, base: str) -> None:
    r = httpx.post(base + "/v1/messages", json={"model": "nope", "messages": HI, "max_tokens": 4})
    assert r.status_code == 404
    assert r.json() == {"type": "error", "error": {"type": "NotFoundError", "message":
                        f"The model `nope` does not exist. Valid aliases: {MODEL}."}}
    assert shape(r.json()) == shape(real("msg_bad_model.json"))
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="nope", messages=HI)  # type: ignore[arg-type]


def test_sdk_maps_bad_input_to_bad_request(client: anthropic.Anthropic, base: str) -> None:
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, messages=HI, max_tokens=0)  # type: ignore[arg-type]
    r = httpx.post(base + "/v1/messages", content=b"{bad", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body.1"
    r = httpx.post(base + "/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 99999})
    assert r.status_code == 400 and r.json()["type"] == "error"  # the chat path's max_model_len check


def test_tool_use_and_tool_result_turns_render(client: anthropic.Anthropic) -> None:
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {"c": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                                     {"type": "text", "text": "Thanks"}]},
    ]
    tools = [{"name": "weather", "input_schema": {"type": "object"}}]
    with_tools = client.messages.count_tokens(model=MODEL, messages=messages, tools=tools)  # type: ignore[arg-type]
    without = client.messages.count_tokens(model=MODEL, messages=messages)  # type: ignore[arg-type]
    assert with_tools.input_tokens > without.input_tokens > 0
