"""The sim's /v1/responses answers as vLLM 0.32 does: bodies, events, usage with cached tokens, errors, store."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from app.sim.testing import running_sim
from tests.sim.shapes import parse_events, real, real_events, shape

MODEL = "smollm2-135m"
LONG = "The quick brown fox jumps over the lazy dog. " * 40


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with running_sim(model=MODEL, profile="cpu-smollm2", time_scale=100.0) as url:
        yield url


@pytest.fixture(scope="module")
def stored() -> Iterator[str]:
    with running_sim(model=MODEL, profile="cpu-smollm2", time_scale=100.0, enable_responses_store=True) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def test_create_through_the_sdk_returns_an_incomplete_response_at_max_output_tokens(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, extra_body={"ignore_eos": True})
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text and r.output[0].type == "message"
    assert r.usage is not None and r.usage.output_tokens == 4 and r.usage.total_tokens == r.usage.input_tokens + 4


def test_whole_body_has_real_vllm_keys_in_order(base: str) -> None:
    got = httpx.post(base + "/v1/responses", json={"model": MODEL, "input": "Say hi.", "max_output_tokens": 4}).json()
    assert shape(got) == shape(real("resp_whole.json"))


async def test_async_create_through_the_sdk(base: str) -> None:
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as aclient:
        r = await aclient.responses.create(model=MODEL, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Say hi."}]}], instructions="Be brief.", max_output_tokens=3,
            extra_body={"ignore_eos": True})
    assert r.instructions == "Be brief." and r.usage is not None and r.usage.output_tokens == 3


def test_stream_through_the_sdk_is_the_real_event_sequence(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=3, stream=True,
                                          extra_body={"ignore_eos": True}))
    want = [name for name, _ in real_events("resp_stream.txt")]
    assert [e.type for e in events] == want
    assert [e.sequence_number for e in events] == list(range(len(want)))
    done = events[-1]
    assert done.type == "response.completed" and done.response.usage is not None
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert done.response.output_text == text and done.response.usage.output_tokens == 3


def test_stream_events_have_real_vllm_keys_in_order_and_no_done_marker(base: str) -> None:
    body = {"model": MODEL, "input": "Say hi.", "max_output_tokens": 3, "stream": True, "ignore_eos": True}
    text = httpx.post(base + "/v1/responses", json=body).text
    assert "[DONE]" not in text
    got = parse_events(text)
    assert [(n, shape(d)) for n, d in got] == [(n, shape(d)) for n, d in real_events("resp_stream.txt")]


def test_a_repeated_prompt_reports_cached_tokens_on_both_paths(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, instructions=LONG, input="Say hi.", max_output_tokens=2)
    again = client.responses.create(model=MODEL, instructions=LONG, input="Say hi.", max_output_tokens=2)
    assert first.usage is not None and again.usage is not None
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert again.usage.input_tokens_details.cached_tokens >= 256  # full 128-token blocks of the shared prefix
    streamed = list(client.responses.create(model=MODEL, instructions=LONG, input="Say hi.", max_output_tokens=2,
                                            stream=True))
    final = streamed[-1]
    assert final.type == "response.completed" and final.response.usage is not None
    assert final.response.usage.input_tokens_details.cached_tokens == again.usage.input_tokens_details.cached_tokens


@pytest.mark.parametrize(
    ("body", "fixture"),
    [
        ({"model": MODEL}, "resp_missing_input.json"),
        ({"model": MODEL, "input": 5}, "resp_bad_input_type.json"),
        ({"model": MODEL, "input": "x", "background": True}, "resp_background.json"),
        ({"model": MODEL, "input": "x", "previous_response_id": "resp_zzz"}, "resp_prev404.json"),
    ],
)
def test_bad_requests_get_the_real_error_body(base: str, body: dict[str, object], fixture: str) -> None:
    r = httpx.post(base + "/v1/responses", json=body)
    want = real(fixture)
    assert r.status_code == want["error"]["code"] and r.json() == want


def test_malformed_json_and_unknown_model_are_4xx_in_the_openai_envelope(client: openai.OpenAI, base: str) -> None:
    r = httpx.post(base + "/v1/responses", content=b"{bad", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "Bad Request"
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="nope", input="x")
    assert e.value.body is not None and "does not exist" in str(e.value.body)


def test_without_the_store_get_and_cancel_answer_404(base: str) -> None:
    assert httpx.get(base + "/v1/responses/resp_nope").json() == real("resp_get404.json")
    r = httpx.post(base + "/v1/responses/resp_nope/cancel")
    assert r.status_code == 404 and r.json()["error"]["message"] == "Response with id 'resp_nope' not found."


def test_with_the_store_a_response_can_be_fetched_and_continued(stored: str) -> None:
    client = openai.OpenAI(base_url=stored + "/v1", api_key="unused", max_retries=0)
    first = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=3, extra_body={"ignore_eos": True})
    fetched = client.responses.retrieve(first.id)
    assert fetched.id == first.id and fetched.output_text == first.output_text
    follow = client.responses.create(model=MODEL, input="And again.", previous_response_id=first.id,
                                     max_output_tokens=2)
    assert follow.previous_response_id == first.id
    assert first.usage is not None and follow.usage is not None
    assert follow.usage.input_tokens > first.usage.input_tokens  # the earlier turn is in the prompt
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        client.responses.cancel(first.id)


def test_with_the_store_a_background_response_is_queued_then_completed(stored: str) -> None:
    client = openai.OpenAI(base_url=stored + "/v1", api_key="unused", max_retries=0)
    queued = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=3, background=True,
                                     extra_body={"ignore_eos": True})
    assert queued.status == "queued" and queued.output == []
    deadline = time.monotonic() + 10
    while (got := client.responses.retrieve(queued.id)).status == "queued" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got.status == "incomplete" and got.usage is not None and got.usage.output_tokens == 3


def test_with_the_store_a_running_background_response_can_be_cancelled(stored: str) -> None:
    client = openai.OpenAI(base_url=stored + "/v1", api_key="unused", max_retries=0)
    queued = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=1500, background=True,
                                     extra_body={"ignore_eos": True})
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    time.sleep(0.05)
    assert client.responses.retrieve(queued.id).status == "cancelled"
