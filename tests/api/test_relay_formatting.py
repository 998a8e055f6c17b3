"""The relay reads an upstream's JSON for what it means, not how it is spaced: spaced, reordered JSON through the
gateway (official SDKs as clients) never leaks the served model name, hides the usage chunk the client did not
ask for, and still accounts usage, finish reasons and stream errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.context import RequestContext
from app.surfaces import CHAT
from app.surfaces.messages.adapter import MessagesObserver
from app.surfaces.openai import ChunkObserver, plain_token_chunk, rewrite_model
from app.surfaces.responses.adapter import ResponseObserver
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway
from tests.servers import serve_in_thread

SERVED = "served-model"
# Python's json module: `", "` and `": "`; the second style also spaces before the colon.
STYLES = [(", ", ": "), (" , ", " : "), (",\t", ":\t")]
USAGE = {"total_tokens": 25, "completion_tokens": 5, "prompt_tokens": 20}
# 20 prompt tokens at $1/M + 5 output tokens at $2/M: the cost trailer shows the reported usage was read.
COST = "0.0000300000"
TENANT = {"id": "acme", "api_keys": ["sk-acme"]}


def spaced(doc: dict[str, Any], i: int = 0) -> bytes:
    """`doc` as valid JSON in one of the non-compact styles, keys in reverse order."""
    item, key = STYLES[i % len(STYLES)]
    return json.dumps(dict(reversed(list(doc.items()))), separators=(item, key)).encode()


def sse(doc: dict[str, Any], i: int, name: str | None = None) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    # Alternate `data: ` and `data:` (both are SSE).
    return head + (b"data: " if i % 2 == 0 else b"data:") + spaced(doc, i) + b"\n\n"


def chat_stream(words: list[str], include_usage: bool) -> Iterator[bytes]:
    """A chat chunk stream in spaced JSON: role chunk, tokens, finish, usage-only chunk, [DONE]."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": SERVED}
    yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]}, 0)  # fmt: skip
    for i, word in enumerate(words, 1):
        reason = "stop" if i == len(words) else None
        yield sse({**base, "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": reason}]}, i)
    if include_usage:
        yield sse({**base, "choices": [], "usage": USAGE}, len(words) + 1)
    yield b"data:[DONE]\n\n"


def responses_stream() -> Iterator[bytes]:
    """A Responses stream in spaced JSON."""
    resp = {"id": "resp_1", "object": "response", "created_at": 1, "model": SERVED, "status": "in_progress",
            "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip
    yield sse({"type": "response.created", "sequence_number": 0, "response": resp}, 0, "response.created")
    yield sse({"type": "response.output_text.delta", "sequence_number": 1, "item_id": "m1", "output_index": 0,
               "content_index": 0, "delta": "Hello", "logprobs": []}, 1, "response.output_text.delta")  # fmt: skip
    done = {**resp, "status": "completed", "usage": {"input_tokens": 20, "output_tokens": 5, "total_tokens": 25,
            "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
            "output": [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}]}  # fmt: skip
    yield sse({"type": "response.completed", "sequence_number": 2, "response": done}, 2, "response.completed")


def messages_stream() -> Iterator[bytes]:
    """An Anthropic Messages stream in spaced JSON."""
    msg: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant", "model": SERVED, "content": [],
           "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 20, "output_tokens": 0}}
    yield sse({"type": "message_start", "message": msg}, 0, "message_start")
    yield sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, 1,
              "content_block_start")  # fmt: skip
    yield sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}, 2,
              "content_block_delta")  # fmt: skip
    yield sse({"type": "content_block_stop", "index": 0}, 3, "content_block_stop")
    yield sse({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
               "usage": {"input_tokens": 20, "output_tokens": 5}}, 4, "message_delta")  # fmt: skip
    yield sse({"type": "message_stop"}, 5, "message_stop")


class SpacedUpstream:
    """A vLLM-compatible upstream that writes valid JSON with whitespace and reversed key order."""

    def app(self) -> Starlette:
        """The ASGI app."""
        return Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/health", lambda r: Response("")),
            Route("/metrics", lambda r: Response('vllm:num_requests_running{model_name="m"} 0\n')),
        ])  # fmt: skip

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        words = ["Hello", " there", "!"]
        if body.get("stream"):
            wants = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(chat_stream(words, wants), media_type="text/event-stream")
        doc = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": SERVED,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(words)},
                            "finish_reason": "stop"}], "usage": USAGE}  # fmt: skip
        return Response(spaced(doc, 1), media_type="application/json")

    async def _responses(self, request: Request) -> Response:
        return StreamingResponse(responses_stream(), media_type="text/event-stream")

    async def _messages(self, request: Request) -> Response:
        return StreamingResponse(messages_stream(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def gw() -> Iterator[str]:
    """A gateway (public name != served name) in front of the spaced upstream."""
    with serve_in_thread(SpacedUpstream().app()) as up, running_gateway(gateway_config([up], tenants=[TENANT])) as gw:
        yield gw


def oai(gw: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw + "/v1", api_key="sk-acme", max_retries=0)


def cost_trailer(text: str) -> str:
    return text.split(": x-kvgate-cost-usd ", 1)[1].split("\n", 1)[0]


def test_spaced_chat_stream_hides_usage_chunk_and_never_leaks_the_served_name(gw: str) -> None:
    chunks = list(oai(gw).chat.completions.create(
        model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there!"
    assert all(c.model == PUBLIC_MODEL for c in chunks)
    assert all(c.usage is None and c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    body = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    text = httpx.post(gw + "/v1/chat/completions", json=body).text
    assert SERVED not in text
    assert cost_trailer(text) == COST  # usage read from the hidden spaced chunk
    assert text.endswith("data: [DONE]\n\n") and text.count("[DONE]") == 1


def test_spaced_usage_chunk_is_relayed_with_the_public_name_when_asked(gw: str) -> None:
    chunks = list(oai(gw).chat.completions.create(
        model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].model == PUBLIC_MODEL
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 25


def test_spaced_complete_body_gets_the_public_name_and_is_billed(gw: str) -> None:
    raw = oai(gw).chat.completions.with_raw_response.create(
        model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}])
    assert raw.parse().model == PUBLIC_MODEL and SERVED not in raw.text
    assert raw.headers["x-kvgate-cost-usd"] == COST


def test_spaced_responses_stream_maps_the_model_and_reads_usage(gw: str) -> None:
    events = list(oai(gw).responses.create(model=PUBLIC_MODEL, input="hi", stream=True))
    assert events[0].response.model == PUBLIC_MODEL  # type: ignore[union-attr]
    assert events[-1].response.model == PUBLIC_MODEL  # type: ignore[union-attr]
    text = httpx.post(gw + "/v1/responses", json={"model": PUBLIC_MODEL, "input": "hi", "stream": True}).text
    assert SERVED not in text and cost_trailer(text) == COST


def test_spaced_messages_stream_maps_the_model_and_reads_usage(gw: str) -> None:
    client = anthropic.Anthropic(base_url=gw, api_key="sk-acme", max_retries=0)
    with client.messages.stream(model=PUBLIC_MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert final.model == PUBLIC_MODEL and final.usage.output_tokens == 5
    body = {"model": PUBLIC_MODEL, "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    text = httpx.post(gw + "/v1/messages", json=body).text
    assert SERVED not in text and cost_trailer(text) == COST


# -- the observers on single events -----------------------------------------------------------------
def ctx_for(public: str = PUBLIC_MODEL) -> RequestContext:
    return RequestContext(request_id="r", surface=CHAT, path="/v1/chat/completions", body={}, model=public,
                          stream=True, client_wants_usage=False, headers={})  # fmt: skip


def test_compact_token_chunk_takes_the_fast_path_and_any_other_spelling_is_parsed() -> None:
    token = b'data: {"id":"c","model":"s","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
    assert plain_token_chunk(token)
    assert not plain_token_chunk(token.replace(b'"finish_reason":null', b'"finish_reason": null'))
    assert not plain_token_chunk(token.replace(b'"finish_reason":null', b'"finish_reason" :"stop"'))
    assert not plain_token_chunk(token.replace(b"]}\n", b'],"usage" : {"prompt_tokens":1}}\n'))
    assert plain_token_chunk(token.replace(b"]}\n", b'],"usage":null}\n'))
    assert not plain_token_chunk(b'data: {"error" : {"message": "x"}}\n\n')


def test_spaced_finish_and_error_chunks_are_accounted_after_the_first_token() -> None:
    ctx = ctx_for()
    obs = ChunkObserver(ctx, SERVED)
    docs: list[dict[str, Any]] = [
        {"model": SERVED, "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]},
        {"model": SERVED, "choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "length"}]},
        {"error": {"message": "engine died", "type": "InternalServerError"}},
    ]
    for i, doc in enumerate(docs):
        out = obs.observe(sse(doc, i))
        assert out is not None and SERVED.encode() not in out
    assert ctx.finish_reasons == ["length"] and ctx.error_type == "upstream_stream_error"
    assert obs.observe(b"data: [DONE]\n\n") is None and obs.done


def test_model_rewrite_covers_every_spacing_and_leaves_other_bytes_alone() -> None:
    for sep in (b'"model":"served-model"', b'"model" : "served-model"', b'"model":\n\t"served-model"'):
        body = b'{"id": "x", ' + sep + b', "content": "served-model is my name"}'
        out = rewrite_model(body, SERVED, PUBLIC_MODEL)
        assert json.loads(out) == {"id": "x", "model": PUBLIC_MODEL, "content": "served-model is my name"}
        assert out.startswith(b'{"id": "x", ')


def test_named_event_observers_rewrite_nested_spaced_model_names() -> None:
    resp = next(responses_stream())
    out = ResponseObserver(ctx_for(), SERVED).observe(resp)
    assert out is not None and json.loads(out.split(b"data: ", 1)[1])["response"]["model"] == PUBLIC_MODEL
    start = next(messages_stream())
    ctx = ctx_for()
    out = MessagesObserver(ctx, SERVED).observe(start)
    assert out is not None and json.loads(out.split(b"data: ", 1)[1])["message"]["model"] == PUBLIC_MODEL
    assert ctx.usage.prompt_tokens == 20
