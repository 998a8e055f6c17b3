"""The sim's HTTP surface: a raw Starlette app with vLLM's OpenAI-compatible, Responses and Messages endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.sim.engine import OutputStream
from app.sim.faults import FailMarker
from app.sim.messages import MessagesSurface
from app.sim.options import SimOptions
from app.sim.orca import orca_header
from app.sim.protocol import GenRequest, SimHTTPError, json_decode_error, parse_generation
from app.sim.request import Status
from app.sim.responses import ResponsesEndpoint, ResponsesSurface
from app.sim.sender import DirectSender
from app.sim.state import SimState, read_post, send_whole, stream_to_end, watch_disconnect
from app.sim.surface import SurfaceEndpoint
from app.sim.tokenize_api import TokenizeApi
from app.sim.wire import (
    DONE,
    VLLM_VERSION,
    ChatChunks,
    CompletionChunks,
    chat_response,
    completion_response,
    usage,
)

_SSE = (b"content-type", b"text/event-stream; charset=utf-8")


class GenerationEndpoint:
    """POST /v1/chat/completions or /v1/completions as a raw ASGI app (the per-token path stays lean)."""

    def __init__(self, state: SimState, kind: str) -> None:
        self.state = state
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one request."""
        st = self.state
        incoming = await read_post(scope, receive, send, st)
        if incoming is None:
            return
        headers, raw, rid, out_headers = incoming.headers, incoming.raw, incoming.request_id, incoming.out_headers
        try:
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise json_decode_error(raw) from None
            prio = headers.get(b"x-vllm-priority")
            gen = parse_generation(
                self.kind,
                body,
                tokenizer=st.tokenizer,
                chat=st.chat,
                served_model=st.options.model,
                max_model_len=st.sched_config.max_model_len,
                priority_enabled=st.sched_config.policy == "priority",
                header_priority=prio.decode() if prio is not None else None,
                default_system=st.default_system,
                render_tools=st.options.render_tools,
                auto_tool_choice=st.options.enable_auto_tool_choice,
                tool_parser=st.options.tool_call_parser,
            )
            pool = st.engine.pool
            if -(-len(gen.prompt_ids) // pool.block_size) > pool.num_blocks:
                raise SimHTTPError(400, "The prompt does not fit in the KV cache.", "BadRequestError", "messages")
            if st.spec_enabled and (_num_set(body, "min_p", 0.0) or body.get("logit_bias")):
                raise SimHTTPError(400, SPEC_UNSUPPORTED_MESSAGE, "BadRequestError", None)  # as vLLM 0.32 answers
        except SimHTTPError as e:
            await send_whole(send, e.status, e.body(), out_headers)
            return
        resp_id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + rid
        if gen.stream:
            out_headers[0] = _SSE
            await send({"type": "http.response.start", "status": 200, "headers": out_headers})
            sender = DirectSender(send, lambda _e: st.engine.abort(stream))
            sink = self._stream_sink(gen, resp_id, sender, lambda: stream)
        else:
            sender, sink = None, None
        stream = st.engine.submit(
            rid,
            gen.prompt_ids,
            n=gen.n,
            max_tokens=gen.max_tokens,
            seed=gen.seed,
            ignore_eos=gen.ignore_eos,
            salt=gen.salt,
            priority=gen.priority,
            sink=sink,
            resume=gen.resume_ids,
        )
        watcher = asyncio.create_task(watch_disconnect(receive, st, stream))
        try:
            if sender is not None:
                await stream_to_end(stream, sender)
            else:
                orca = headers.get(b"endpoint-load-metrics-format")
                await self._whole(send, gen, stream, resp_id, out_headers, orca.decode("latin-1") if orca else "")
        finally:
            watcher.cancel()
            if not stream.finished:
                st.engine.abort(stream)

    def _usage(self, gen: GenRequest, stream: OutputStream, streaming: bool) -> dict[str, Any]:
        first = stream.reqs[0]
        cached = max(first.cached_tokens, 0)
        bs = first.block_size
        return usage(
            gen.kind,
            streaming=streaming,
            prompt=len(gen.prompt_ids),
            completion=sum(r.num_output for r in stream.reqs),
            cached=cached,
            created_cache=max(len(gen.prompt_ids) // bs * bs - cached, 0),
            details=self.state.options.enable_prompt_tokens_details,
        )

    async def _whole(
        self, send: Send, gen: GenRequest, stream: OutputStream, resp_id: str, headers: list[tuple[bytes, bytes]],
        load_format: str = "",
    ) -> None:
        while not stream.finished and not stream.closed:
            await stream.event.wait()
            stream.drain()
        if stream.closed:
            return
        engine, st = self.state.engine, self.state
        choices = [(engine.text_of(r, 0, r.num_output), r.finish_reason or "stop") for r in stream.reqs]
        if gen.echo_prompt:
            choices = [(gen.echo_prompt + t, fr) for t, fr in choices]
        build = chat_response if gen.kind == "chat" else completion_response
        body = build(resp_id, int(time.time()), st.options.model, choices, self._usage(gen, stream, False))
        # As vLLM: its gauges when the reply is built (this request already finished), on whole replies only.
        report = orca_header(load_format, len(engine.scheduler.waiting), engine.pool.usage()) if load_format else None
        if report is not None:
            headers = [*headers, (b"endpoint-load-metrics", report)]
        await send_whole(send, 200, body, headers)

    def _stream_sink(
        self, gen: GenRequest, resp_id: str, sender: DirectSender, get_stream: Callable[[], OutputStream]
    ) -> Callable[[int, int, int], None]:
        """The per-step writer the engine calls with (choice, first output index, count); no task wake-ups."""
        engine = self.state.engine
        chunks: ChatChunks | CompletionChunks = (ChatChunks if gen.kind == "chat" else CompletionChunks)(
            resp_id, int(time.time()), self.state.options.model
        )
        pending_roles = [b"".join(chunks.role(i) for i in range(gen.n))]
        text_of, json_text_of, content = engine.text_of, engine.json_text_of, chunks.content
        continuous, echo = gen.continuous_usage, gen.echo_prompt

        def sink(idx: int, start: int, count: int) -> None:
            stream = get_stream()
            req = stream.reqs[idx]
            last = req.status is Status.FINISHED and start + count == req.num_output
            if last or continuous or (start == 0 and echo):
                text = text_of(req, start, count)
                if start == 0 and echo:
                    text = echo + text
                cont = self._usage(gen, stream, True) if continuous else None
                body = chunks.delta(idx, text, (req.finish_reason or "stop") if last else None, cont)
            else:
                body = content(idx, json_text_of(req, start, count))
            if pending_roles:
                body = pending_roles.pop() + body
            final = stream.done >= stream.n
            if final:
                if gen.include_usage:
                    body += chunks.usage_chunk(self._usage(gen, stream, True))
                body += DONE
            sender.write({"type": "http.response.body", "body": body, "more_body": not final})

        return sink


SPEC_UNSUPPORTED_MESSAGE = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)


def _num_set(body: dict[str, Any], name: str, neutral: float) -> bool:
    v = body.get(name)
    return isinstance(v, int | float) and not isinstance(v, bool) and v != neutral


class _SimStarlette(Starlette):
    """Starlette with the two generation routes served before the middleware stack (the per-token path)."""

    fast_routes: dict[str, ASGIApp]
    faults: FailMarker | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Dispatch generation requests directly; everything else through Starlette (injected faults first)."""
        if self.faults is not None:
            await self.faults(scope, receive, send)
        else:
            await self.serve(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The routes: generation directly, everything else through Starlette."""
        if scope["type"] == "http":
            endpoint = self.fast_routes.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_sim_app(options: SimOptions) -> Starlette:
    """A Starlette app behaving like one vLLM replica with `options`; the engine runs while the app lives."""
    st = SimState(options)

    pool = st.engine.pool
    cache_info = {
        "block_size": str(pool.block_size),
        "enable_prefix_caching": str(options.enable_prefix_caching),
        "num_gpu_blocks": str(pool.num_blocks),
        "kv_cache_size_tokens": str(pool.num_blocks * pool.block_size),
        "prefix_caching_hash_algo": pool.hash_algo,
    }
    if options.publish_max_num_seqs:  # vLLM 0.32 has no such label (only /server_info in dev mode shows it)
        cache_info["max_num_seqs"] = str(st.sched_config.max_num_seqs)

    async def health(_: Request) -> Response:
        return Response(status_code=200 if st.engine.healthy else 503)

    async def version(_: Request) -> Response:
        return JSONResponse({"version": VLLM_VERSION})

    async def models(_: Request) -> Response:
        card = {
            "id": options.model, "object": "model", "created": st.created, "owned_by": "vllm",
            "root": options.tokenizer or options.model, "parent": None, "max_model_len": st.sched_config.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission", "created": st.created,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        }  # fmt: skip
        return Response(orjson.dumps({"object": "list", "data": [card]}), media_type="application/json")

    async def metrics(_: Request) -> Response:
        text = st.engine.metrics.render(st.engine.scheduler, spec_enabled=st.spec_enabled, cache_info=cache_info)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def reset_prefix_cache(_: Request) -> Response:
        # vLLM answers 200 with {"success": bool}; it refuses while blocks are in use.
        ok = st.engine.reset_prefix_cache()
        return Response(orjson.dumps({"success": ok}), media_type="application/json")

    async def step_trace(_: Request) -> Response:
        trace = st.engine.trace
        if trace is None:
            return JSONResponse({"detail": "start the sim with --step-trace"}, status_code=404)
        return Response(orjson.dumps(trace.snapshot(options.time_scale)), media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await st.engine.start()
        try:
            yield
        finally:
            await st.engine.stop()

    chat, completions = GenerationEndpoint(st, "chat"), GenerationEndpoint(st, "completion")
    tok = TokenizeApi(st)
    responses_api, messages_api = ResponsesSurface(st), MessagesSurface(st)
    responses = ResponsesEndpoint(st, responses_api)
    messages = SurfaceEndpoint(st, messages_api)
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenize", tok.tokenize, methods=["POST"]),
        Route("/detokenize", tok.detokenize, methods=["POST"]),
        Route("/v1/chat/completions/render", tok.render_chat, methods=["POST"]),
        Route("/v1/completions/render", tok.render_completion, methods=["POST"]),
        Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
        Route("/sim/step_trace", step_trace, methods=["GET"]),
        Route("/v1/chat/completions", chat),
        Route("/v1/completions", completions),
        Route("/v1/responses/{response_id}", responses_api.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", responses_api.cancel, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages_api.count_tokens, methods=["POST"]),
    ]
    app = _SimStarlette(routes=routes, lifespan=lifespan)
    app.fast_routes = {"/v1/chat/completions": chat, "/v1/completions": completions, "/v1/responses": responses,
                       "/v1/messages": messages}  # fmt: skip
    app.state.sim = st
    if options.fail_marker:
        app.faults = FailMarker(app.serve, options.fail_marker)
    return app
