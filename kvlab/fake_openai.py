"""A small OpenAI-compatible chat server on loopback (aiohttp) with known delays and usage, for bench tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

BAD_KEY = "sk-bad"


@dataclass
class FakeOpenAI:
    """Streams `tokens` tokens (capped by max_tokens): the first after `first_delay_s`, then one per `token_delay_s`.

    Usage: prompt tokens = characters of the messages // 4, cached = `cached_tokens` (capped by the prompt),
    completion = tokens sent. A request with API key BAD_KEY gets 401; `send_usage=False` omits usage.
    """

    tokens: int = 5
    first_delay_s: float = 0.05
    token_delay_s: float = 0.01
    cached_tokens: int = 16
    send_usage: bool = True
    model: str = "fake-model"
    received: list[dict[str, Any]] = field(default_factory=list)
    sent_usage: list[dict[str, int]] = field(default_factory=list)

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    def _usage(self, body: dict[str, Any], completion: int) -> dict[str, Any]:
        prompt = len(orjson.dumps(body["messages"])) // 4
        cached = min(self.cached_tokens, prompt)
        self.sent_usage.append({"prompt": prompt, "cached": cached, "completion": completion})
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json(loads=orjson.loads)
        self.received.append({"body": body, "headers": dict(request.headers)})
        if request.headers.get("Authorization") == f"Bearer {BAD_KEY}":
            return web.json_response({"error": {"message": "bad key", "type": "authentication_error"}}, status=401)
        n = min(self.tokens, int(body.get("max_tokens") or self.tokens))
        if not body.get("stream"):
            await asyncio.sleep(self.first_delay_s + self.token_delay_s * (n - 1))
            return web.json_response({
                "id": "chatcmpl-x", "object": "chat.completion", "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * n},
                             "finish_reason": "length"}],
                "usage": self._usage(body, n),
            })
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def event(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")

        await event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(self.first_delay_s)
        for i in range(n):
            if i:
                await asyncio.sleep(self.token_delay_s)
            await event({"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]})
        await event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        include = (body.get("stream_options") or {}).get("include_usage")
        if self.send_usage and include:
            await event({"choices": [], "usage": self._usage(body, n)})
        await resp.write(b"data: [DONE]\n\n")
        return resp


@asynccontextmanager
async def serving(fake: FakeOpenAI) -> AsyncIterator[str]:
    """Serve `fake` on a free loopback port inside the running loop; yields the base URL."""
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
