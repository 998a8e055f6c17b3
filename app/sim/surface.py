"""One generation endpoint for the agent APIs (Responses, Messages): parse, run on the engine, answer or stream.

Each API supplies a Surface: how to parse its body into a Job and how to write its whole body and its SSE events.
The engine, scheduler and KV cache are the chat endpoint's, so prefix caching and cached-token counts carry over.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from starlette.types import Receive, Scope, Send

from app.sim.engine import OutputStream
from app.sim.protocol import SimHTTPError, json_decode_error
from app.sim.request import SimRequest, Status
from app.sim.sender import DirectSender
from app.sim.state import SimState, read_post, send_whole, stream_to_end, watch_disconnect

SSE_HEADER = (b"content-type", b"text/event-stream; charset=utf-8")


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one finished request, as the engine saw them."""

    prompt: int
    completion: int
    cached: int  # prefix-cache hit at admission
    created_cache: int  # full prompt blocks this request wrote to the cache


@dataclass(slots=True)
class Job:
    """A parsed request ready for the engine, plus whatever its surface needs to answer it."""

    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    seed: int | None = None
    ignore_eos: bool = False
    salt: str | None = None
    priority: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    resume_ids: tuple[int, ...] = ()  # see GenRequest.resume_ids


class StreamWriter(Protocol):
    """The SSE bytes of one streamed answer."""

    def head(self) -> bytes:
        """Events before any text (sent when the stream opens, or with the first text; see `head_first`)."""

    def delta(self, text: str) -> bytes:
        """Events for one step's text (not called with empty text)."""

    def tail(self, finish_reason: str, usage: Usage) -> bytes:
        """The closing events."""


class Surface(Protocol):
    """What one API adds around the engine."""

    head_first: bool  # True: head() goes out as soon as the stream opens (Responses); False: with the first step

    def parse(self, body: Any, rid: str, headers: dict[bytes, bytes]) -> Job:
        """Validate the body and render its prompt; raise SimHTTPError (or a subclass with its own envelope)."""

    def decode_error(self, raw: bytes) -> SimHTTPError:
        """The error for a body that is not JSON."""

    def whole(self, job: Job, text: str, finish_reason: str, usage: Usage) -> bytes:
        """The non-streaming body."""

    def writer(self, job: Job) -> StreamWriter:
        """A writer for one streamed answer."""


def usage_of(req: SimRequest) -> Usage:
    """Usage of a finished one-choice request: vLLM counts created cache as full prompt blocks not hit."""
    cached = max(req.cached_tokens, 0)
    bs = req.block_size
    return Usage(req.num_prompt, req.num_output, cached, max(req.num_prompt // bs * bs - cached, 0))


class SurfaceEndpoint:
    """A raw ASGI app for one POST route of an agent API."""

    def __init__(self, state: SimState, surface: Surface) -> None:
        self.state = state
        self.surface = surface

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one request."""
        st, surface = self.state, self.surface
        incoming = await read_post(scope, receive, send, st)
        if incoming is None:
            return
        headers, raw, rid, out_headers = incoming.headers, incoming.raw, incoming.request_id, incoming.out_headers
        try:
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise surface.decode_error(raw) from None
            job = surface.parse(body, rid, headers)
            pool = st.engine.pool
            if -(-len(job.prompt_ids) // pool.block_size) > pool.num_blocks:
                raise SimHTTPError(400, "The prompt does not fit in the KV cache.", "BadRequestError", "messages")
        except SimHTTPError as e:
            await send_whole(send, e.status, e.body(), out_headers)
            return
        await self.run(job, send, receive, out_headers, self.state.accept_rules.for_body(raw))

    async def run(
        self, job: Job, send: Send, receive: Receive, out_headers: list[tuple[bytes, bytes]], accept: float = -1.0
    ) -> None:
        """Submit `job` to the engine and answer it (streamed or whole); `accept`: its drafts' acceptance."""
        st = self.state
        sender: DirectSender | None = None
        sink = None
        if job.stream:
            out_headers = [SSE_HEADER, *out_headers[1:]]
            await send({"type": "http.response.start", "status": 200, "headers": out_headers})
            sender = DirectSender(send, lambda _e: st.engine.abort(stream))
            writer = self.surface.writer(job)
            if self.surface.head_first:
                sender.write({"type": "http.response.body", "body": writer.head(), "more_body": True})
            sink = self._sink(writer, sender, lambda: stream)
        stream = st.engine.submit(
            uuid.uuid4().hex[:16],
            job.prompt_ids,
            n=1,
            max_tokens=job.max_tokens,
            seed=job.seed,
            ignore_eos=job.ignore_eos,
            salt=job.salt,
            priority=job.priority,
            sink=sink,
            resume=job.resume_ids,
            accept=accept,
        )
        watcher = asyncio.create_task(watch_disconnect(receive, st, stream))
        try:
            if sender is not None:
                await stream_to_end(stream, sender)
            else:
                while not stream.finished and not stream.closed:
                    await stream.event.wait()
                    stream.drain()
                if stream.closed:
                    return
                req = stream.reqs[0]
                text = st.engine.text_of(req, 0, req.num_output)
                body = self.surface.whole(job, text, req.finish_reason or "stop", usage_of(req))
                await send_whole(send, 200, body, out_headers)
        finally:
            watcher.cancel()
            if not stream.finished:
                st.engine.abort(stream)

    def _sink(
        self, writer: StreamWriter, sender: DirectSender, get_stream: Callable[[], OutputStream]
    ) -> Callable[[int, int, int], None]:
        """The per-step writer the engine calls with (choice, first output index, count)."""
        text_of = self.state.engine.text_of
        pending_head = [] if self.surface.head_first else [writer.head()]

        def sink(idx: int, start: int, count: int) -> None:
            req = get_stream().reqs[idx]
            text = text_of(req, start, count)
            body = pending_head.pop() if pending_head else b""
            if text:
                body += writer.delta(text)
            final = req.status is Status.FINISHED
            if final:
                body += writer.tail(req.finish_reason or "stop", usage_of(req))
            if body or final:
                sender.write({"type": "http.response.body", "body": body, "more_body": not final})

        return sink


def decode_error(raw: bytes) -> SimHTTPError:
    """vLLM's body for malformed JSON (shared by both agent APIs: FastAPI answers it before the handler)."""
    return json_decode_error(raw)
