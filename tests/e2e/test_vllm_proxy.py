"""The proxy core against two real vLLM-CPU servers, through the official openai SDK."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL
from tests.e2e.vllm_stack import metric_value

pytestmark = pytest.mark.vllm

# ~1,200 tokens of static text: long enough for many full 16-token blocks to be cached.
LONG_PROMPT = " ".join(f"Rule {i}: every request must be logged with its tenant, pool and cost." for i in range(90))


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="EMPTY", max_retries=0, timeout=300)


def test_chat_and_completions_through_gateway(e2e_gateway: str) -> None:
    client = sdk(e2e_gateway)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0
    )
    assert chat.model == MODEL
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens > 0
    comp = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert comp.choices[0].text


@pytest.mark.parametrize("include_usage", [True, False])
def test_streaming_with_and_without_usage(e2e_gateway: str, include_usage: bool) -> None:
    kwargs = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(
        sdk(e2e_gateway).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12, stream=True,
            temperature=0, **kwargs,  # type: ignore[arg-type]
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage_chunks = [c for c in chunks if c.usage is not None]
    if include_usage:
        assert len(usage_chunks) == 1 and usage_chunks[0].usage.completion_tokens > 0  # type: ignore[union-attr]
    else:
        assert usage_chunks == []


def test_repeated_long_prompt_reports_cached_tokens(e2e_gateway: str) -> None:
    client = sdk(e2e_gateway)
    results = []
    for _ in range(2):
        resp = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "system", "content": LONG_PROMPT}, {"role": "user", "content": "OK?"}],
            max_tokens=2, temperature=0, extra_headers={"x-kvgate-class": "bulk"},
        )
        results.append(resp.parse())
        assert "pool=bulk" in resp.headers["x-kvgate-route"]
    second = results[1].usage
    assert second is not None and second.prompt_tokens > 1000
    assert second.prompt_tokens_details is not None
    assert (second.prompt_tokens_details.cached_tokens or 0) >= 1000


def test_unknown_model_is_404(e2e_gateway: str) -> None:
    with pytest.raises(openai.NotFoundError):
        sdk(e2e_gateway).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_client_disconnect_frees_the_vllm_sequence(e2e_gateway: str, vllm_urls: dict[str, str]) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", e2e_gateway + "/v1/chat/completions", json=body, timeout=300,
                      headers={"x-kvgate-class": "interactive"}) as r:
        assert r.status_code == 200
        # The engine the gateway chose (an interactive request may borrow bulk); vLLM's gauge follows its
        # steps, so it is read while the stream goes on rather than once.
        route = dict(part.split("=", 1) for part in r.headers["x-kvgate-route"].split(";"))
        engine = vllm_urls[route["pool"]]
        seen, running, deadline = 0, 0.0, time.monotonic() + 15
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen >= 3:
                running = metric_value(engine, "vllm:num_requests_running")
                if running >= 1 or time.monotonic() > deadline:
                    break
        assert running >= 1
    deadline = time.monotonic() + 30
    while metric_value(engine, "vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert metric_value(engine, "vllm:num_requests_running") == 0
