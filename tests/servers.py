"""Real servers on loopback for tests: uvicorn apps in background threads, and an OpenAI-compatible fake upstream."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvlab.net import free_port as free_port  # re-exported: tests import it from here


@contextmanager
def running(config: uvicorn.Config) -> Iterator[str]:
    """Run a uvicorn server of `config` in a thread until the block ends; yield its base URL once it listens."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"server on {config.host}:{config.port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://{config.host}:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def serve_in_thread(app: Any, port: int | None = None) -> Iterator[str]:
    """Run an ASGI app with uvicorn on a loopback port in a thread; yield its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port or free_port(), log_level="error", lifespan="on",
                            loop="asyncio", timeout_graceful_shutdown=1)
    with running(config) as url:
        yield url


@dataclass
class FakeUpstream:
    """An OpenAI/vLLM-compatible upstream whose behaviour the prompt selects (`mode:<name>` in the last message).

    Modes: ok (default), slow (1.5 s before answering), fail500, bad400, text400 (a proxy's text/plain 400),
    midstream (stream breaks after 3 chunks),
    hang (never answers), drip (a chunk every 0.2 s for 100 chunks).
    """

    served_model: str = "served-model"
    cached_tokens: int = 0
    seen: list[dict[str, Any]] = field(default_factory=list)
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    active: int = 0
    aborted: int = 0

    def app(self) -> Starlette:
        """The ASGI app."""
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._chat, methods=["POST"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
                Route("/health", lambda r: Response("")),
                Route("/metrics", lambda r: Response(f"vllm:num_requests_running{{model_name=\"m\"}} {self.active}\n")),
            ]
        )

    def _mode(self, body: dict[str, Any]) -> str:
        text = ""
        if "messages" in body:
            text = str(body["messages"][-1].get("content", ""))
        elif "prompt" in body:
            text = str(body["prompt"])
        return text.split("mode:", 1)[1].split()[0] if "mode:" in text else "ok"

    def _usage(self, completion: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": 20, "total_tokens": 20 + completion, "completion_tokens": completion}
        if self.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    async def _embeddings(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.seen.append(body)
        return JSONResponse(
            {"object": "list", "model": self.served_model, "data": [{"object": "embedding", "index": 0,
             "embedding": [0.1, 0.2]}], "usage": {"prompt_tokens": 3, "total_tokens": 3}}
        )

    async def _chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.seen.append(body)
        self.seen_headers.append(dict(request.headers))
        mode = self._mode(body)
        rid = request.headers.get("x-request-id", "none")
        chat = request.url.path.endswith("chat/completions")
        if mode == "fail500":
            return JSONResponse({"error": {"message": "engine dead", "type": "InternalServerError"}}, status_code=500)
        if mode == "bad400":
            return JSONResponse(
                {"object": "error", "message": "max_tokens too large", "type": "BadRequestError", "param": None,
                 "code": 400}, status_code=400)
        if mode == "text400":
            return Response("400 Bad Request: header too long\n", status_code=400, media_type="text/plain")
        if mode == "slow":
            await asyncio.sleep(1.5)
        if mode == "hang":
            await asyncio.sleep(3600)
        words = ["Hello", " there", ",", " friend", "!"]
        if not body.get("stream"):
            msg = {"role": "assistant", "content": "".join(words)} if chat else None
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            choice.update({"message": msg} if chat else {"text": "".join(words)})
            doc = {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": 1, "model": self.served_model,
                   "choices": [choice], "usage": self._usage(len(words))}
            return Response(orjson.dumps(doc), media_type="application/json")
        return StreamingResponse(self._stream(body, rid, mode, chat, words), media_type="text/event-stream")

    async def _stream(self, body: dict[str, Any], rid: str, mode: str, chat: bool, words: list[str]) -> Any:
        self.active += 1
        finished = False
        try:
            count = 100 if mode == "drip" else len(words)
            for i in range(count):
                if mode == "midstream" and i == 3:
                    raise ConnectionResetError("engine died mid-stream")
                if mode == "drip":
                    await asyncio.sleep(0.2)
                word = words[i % len(words)]
                choice = {"index": 0, "delta": {"content": word}, "finish_reason": None} if chat else {
                    "index": 0, "text": word, "finish_reason": None}
                if i == count - 1:
                    choice["finish_reason"] = "stop"
                doc = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": 1,
                       "model": self.served_model, "choices": [choice]}
                yield b"data: " + orjson.dumps(doc) + b"\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                doc = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": 1,
                       "model": self.served_model, "choices": [], "usage": self._usage(count)}
                yield b"data: " + orjson.dumps(doc) + b"\n\n"
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            self.active -= 1
            if not finished:
                self.aborted += 1
