"""The SSE reader: events split across network reads, multi-token chunks, errors inside the stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from aiohttp import web

from app.bench.client import BenchClient, api_root
from app.bench.spec import RequestRecord
from app.bench.workloads import BenchRequest


def _event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


@asynccontextmanager
async def _serve_bytes(pieces: list[bytes], status: int = 200) -> AsyncIterator[str]:
    """A server that answers every POST by writing `pieces` one network write at a time."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=status, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(piece)
            await asyncio.sleep(0.005)  # separate reads on the client side
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def _send(base: str) -> tuple[RequestRecord, str]:
    client = BenchClient(base, connections=2, timeout_s=10)
    rec = RequestRecord(index=0, session=0, turn=0, tenant=0, route_class="interactive")
    req = BenchRequest(body={"model": "m", "messages": [], "stream": True}, headers={}, api_key="k",
                       session=0, turn=0, tenant=0, route_class="interactive")
    try:
        text = await client.send(req, rec, t0=0.0)
    finally:
        await client.close()
    return rec, text


def test_api_root_accepts_urls_with_or_without_v1() -> None:
    assert api_root("http://h:1") == api_root("http://h:1/") == api_root("http://h:1/v1/") == "http://h:1/v1"


async def test_events_split_mid_line_are_reassembled() -> None:
    stream = (_event({"choices": [{"delta": {"role": "assistant"}}]})
              + _event({"choices": [{"delta": {"content": "Hello"}}]})
              + _event({"choices": [{"delta": {"content": " world"}}]})
              + _event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}})
              + b"data: [DONE]\n\n")
    pieces = [stream[i:i + 11] for i in range(0, len(stream), 11)]  # cuts through JSON and "data:" prefixes
    async with _serve_bytes(pieces) as base:
        rec, text = await _send(base)
    assert rec.ok and text == "Hello world"
    assert (rec.prompt_tokens, rec.output_tokens, rec.cached_tokens) == (7, 2, 0)
    assert rec.token_chunks == 2 and len(rec.itl_s) == 1


async def test_multi_token_chunks_give_tpot_from_usage_not_chunk_count() -> None:
    stream = (_event({"choices": [{"delta": {"content": "a b c"}}]})
              + _event({"choices": [{"delta": {"content": " d e f"}}]})
              + _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6,
                                                  "prompt_tokens_details": {"cached_tokens": 2}}})
              + b"data: [DONE]\n\n")
    async with _serve_bytes([stream[: len(stream) // 2], stream[len(stream) // 2:]]) as base:
        rec, _ = await _send(base)
    assert rec.output_tokens == 6 and rec.token_chunks == 2 and rec.cached_tokens == 2
    assert rec.tpot_s is not None and rec.e2e_s is not None and rec.ttft_s is not None
    assert abs(rec.tpot_s - (rec.e2e_s - rec.ttft_s) / 5) < 1e-12


async def test_error_event_inside_a_stream_fails_the_request() -> None:
    stream = (_event({"choices": [{"delta": {"content": "x"}}]})
              + _event({"error": {"message": "engine died", "type": "server_error"}}))
    async with _serve_bytes([stream]) as base:
        rec, _ = await _send(base)
    assert not rec.ok and "engine died" in (rec.error or "")


async def test_empty_stream_is_an_error() -> None:
    async with _serve_bytes([b": keep-alive\n\n"]) as base:
        rec, _ = await _send(base)
    assert not rec.ok and rec.error == "stream ended without data"


async def test_http_error_status_is_recorded_with_the_envelope_message() -> None:
    body = orjson.dumps({"error": {"message": "slow down", "type": "rate_limit_error"}})
    async with _serve_bytes([body], status=429) as base:
        rec, _ = await _send(base)
    assert not rec.ok and rec.status == 429 and "rate_limit_error: slow down" in (rec.error or "")
