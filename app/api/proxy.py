"""The inference endpoints as raw ASGI apps: the hot path skips framework layers it does not need."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from starlette.types import Message, Receive, Scope, Send

from app.api.parse import parse_request, request_id_from
from app.api.surfaces import SURFACES, Surface
from app.errors import GatewayError, too_large
from app.headers import REQUEST_ID
from app.pipeline import Gateway, Reply


def headers_of(scope: Scope) -> dict[str, str]:
    """An ASGI scope's headers as a dict with lowercase names."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_reply(send: Send, reply: Reply, before_last: Callable[[], None]) -> None:
    """Write a Reply to the ASGI channel; `before_last` runs just before the final body message."""
    raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    await send({"type": "http.response.start", "status": reply.status, "headers": raw_headers})
    if reply.stream is None:
        before_last()
        await send({"type": "http.response.body", "body": reply.body, "more_body": False})
        return
    async for chunk in reply.stream:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    before_last()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class InferenceEndpoint:
    """Every inference path: its surface parses, the gateway runs the stages, this relays the reply."""

    def __init__(self, gateway: Callable[[], Gateway]) -> None:
        self._gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Parse, run the pipeline, relay; a client that goes away cancels the work (and the upstream call)."""
        started = time.perf_counter()
        gateway = self._gateway()
        headers = headers_of(scope)
        request_id = request_id_from(headers)
        surface = SURFACES[scope["path"]]
        if scope["method"] != "POST":
            err = GatewayError(405, f"Method {scope['method']} not allowed; use POST.", code="method_not_allowed")
            await send_reply(send, _plain_error(surface, err, request_id), lambda: None)
            return
        try:
            raw = await _read_body(receive, headers, gateway.cfg.upstream.max_body_bytes)
            ctx = parse_request(scope["path"], raw, headers, gateway.cfg, request_id, surface)
        except GatewayError as err:
            await send_reply(send, _plain_error(surface, err, request_id), lambda: None)
            return
        except asyncio.CancelledError:
            return
        ctx.timing.start = started

        main = asyncio.current_task()
        cancelled = False
        state = {"done": False, "disconnected": False}

        async def watch_disconnect() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    if not state["done"] and main is not None:
                        state["disconnected"] = True
                        main.cancel()
                    return

        watcher = asyncio.create_task(watch_disconnect())
        try:
            reply = await gateway.handle(ctx)
            await send_reply(send, reply, lambda: state.__setitem__("done", True))
        except asyncio.CancelledError:
            if not state["disconnected"]:
                raise
            if main is not None:
                main.uncancel()
            cancelled = True
        except OSError:
            ctx.error_type = ctx.error_type or "client_disconnected"
        finally:
            watcher.cancel()
            await gateway.finished(ctx, cancelled=cancelled)


def _plain_error(surface: Surface, err: GatewayError, request_id: str) -> Reply:
    headers = {"content-type": "application/json", REQUEST_ID: request_id, **err.headers}
    return Reply(err.status, headers, surface.error_body(err))
