"""The inference endpoints as raw ASGI apps: the hot path skips framework layers it does not need.

Whatever goes wrong on the way, the client gets its API's envelope: a GatewayError as it says, any other
exception as a 500 (logged with the request id), or, once a stream has started, the surface's error event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson
from starlette.types import Message, Receive, Scope, Send

from app.api.parse import parse_request, request_id_from, single_credentials, too_deep
from app.api.request_channel import channel_of
from app.errors import GatewayError, too_large
from app.gateway import Gateway
from app.headers import API_KEY, REQUEST_ID
from app.reply import Reply
from app.surfaces import SURFACES, Surface
from app.telemetry.rejections import log_rejection

if TYPE_CHECKING:
    from app.api.server import ConnectionStats

log = logging.getLogger(__name__)


def headers_of(scope: Scope, lowered: bool = False) -> dict[str, str]:
    """An ASGI scope's headers as a dict with lowercase names; `lowered`: the server lowercased them already (the
    guarded protocol does, as uvicorn's), so no `.lower()` per header."""
    if lowered:
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def internal_error(request_id: str) -> GatewayError:
    """500: an exception the request path did not expect (the log has it under the request id)."""
    return GatewayError(500, f"The gateway failed on this request (request id {request_id}).", type="server_error",
                        code="internal_error")


def cut_at_drain() -> GatewayError:
    """503: the gateway is shutting down and its drain time ran out before this request finished."""
    return GatewayError(503, "The gateway shut down before this request finished; retry it.",
                        type="service_unavailable", code="shutting_down", headers={"connection": "close"})


def body_timeout(seconds: float) -> GatewayError:
    """408: the client did not send its whole body in time; the connection is closed after the answer."""
    return GatewayError(408, f"The request body did not arrive within {seconds:g} s.", code="request_timeout",
                        headers={"connection": "close"})


async def _read_body(
    receive: Receive, headers: dict[str, str], limit: int, deadline_s: float, arrived: bool = False
) -> bytes:
    """The whole body; `arrived`: the server has parsed all of it already, so the read needs no deadline."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    if arrived:
        return await _body(receive, limit)
    try:
        async with asyncio.timeout(deadline_s):
            return await _body(receive, limit)
    except TimeoutError:
        raise body_timeout(deadline_s) from None


async def _body(receive: Receive, limit: int) -> bytes:
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


async def send_reply(
    send: Send, reply: Reply, before_last: Callable[[], None], on_start: Callable[[], None] | None = None
) -> None:
    """Write a Reply to the ASGI channel; `on_start` runs as the status line goes, `before_last` just before
    the final body message."""
    raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    if reply.stream is None and "content-length" not in reply.headers:
        # A known length spares the chunked framing (and lets a client read the body before the close).
        raw_headers.append((b"content-length", str(len(reply.body)).encode()))
    if on_start is not None:
        on_start()
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

    def __init__(self, gateway: Callable[[], Gateway], stats: ConnectionStats | None = None) -> None:
        self._gateway = gateway
        self._stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Parse, run the pipeline, relay; a client that goes away cancels the work (and the upstream call)."""
        started = time.perf_counter()
        gateway = self._gateway()
        channel = channel_of(scope)
        headers = headers_of(scope, lowered=channel is not None)
        request_id = request_id_from(headers)
        surface = SURFACES[scope["path"]]
        if scope["method"] != "POST":
            err = GatewayError(405, f"Method {scope['method']} not allowed; use POST.", code="method_not_allowed")
            log_rejection(scope["path"], err.status, err.reason, None)
            await send_reply(send, _plain_error(surface, err, request_id), lambda: None)
            return
        listen = gateway.cfg.listen
        try:
            single_credentials(scope["headers"], headers)
            raw = await _read_body(receive, headers, gateway.cfg.upstream.max_body_bytes, listen.body_timeout_s,
                                   channel is not None and channel.body_complete)
            ctx = parse_request(scope["path"], raw, headers, gateway.cfg, request_id, surface)
        except GatewayError as err:
            if err.status == 408 and self._stats is not None:
                self._stats.timed_out("body")
            log_rejection(scope["path"], err.status, err.reason, await _tenant_id(gateway, headers))
            await send_reply(send, _plain_error(surface, err, request_id), lambda: None)
            return
        except asyncio.CancelledError:
            return
        except orjson.JSONEncodeError:
            await send_reply(send, _plain_error(surface, too_deep(), request_id), lambda: None)
            return
        except Exception:
            log.exception("request %s: parsing failed", request_id)
            await send_reply(send, _plain_error(surface, internal_error(request_id), request_id), lambda: None)
            return
        ctx.timing.start = started
        ctx.client = scope["client"][0] if scope.get("client") else ""

        main = asyncio.current_task()
        cancelled = False
        state = {"done": False, "disconnected": False, "started": False}

        def client_left() -> None:
            if not state["done"] and main is not None:
                state["disconnected"] = True
                main.cancel()

        async def watch_disconnect() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    client_left()
                    return

        # The guarded server's protocol calls back when the connection drops; under any other server a task
        # waits on receive() for the disconnect message.
        watcher = None
        if channel is not None:
            channel.when_lost(client_left)
        else:
            watcher = asyncio.create_task(watch_disconnect())
        try:
            reply = await gateway.handle(ctx)
            if not ctx.upstream_called:  # a replica's own 4xx is relayed, not the gateway's to report
                log_rejection(ctx.path, reply.status, ctx.error_type, ctx.tenant.id if ctx.tenant else None)
            await send_reply(
                send, reply, lambda: state.__setitem__("done", True), lambda: state.__setitem__("started", True)
            )
        except asyncio.CancelledError:
            if not state["disconnected"]:
                # The server cut the request (the drain ran out): the client still gets a proper end.
                ctx.error_type = ctx.error_type or "draining"
                end = surface.stream_observer(ctx, ctx.model).ending(b"")  # the protocol's end marker ([DONE])
                await _answer_failure(send, surface, request_id, cut_at_drain(), started=state["started"],
                                      done=state["done"], end=end)
                raise
            if main is not None:
                main.uncancel()
            cancelled = True
        except OSError:
            ctx.error_type = ctx.error_type or "client_disconnected"
        except orjson.JSONEncodeError:
            # A stage re-serializing part of a body orjson could parse but cannot write: the body's fault.
            ctx.status, ctx.error_type = 400, "invalid_json"
            await _answer_failure(send, surface, request_id, too_deep(), started=state["started"], done=state["done"])
        except Exception:
            log.exception("request %s: failed on the request path", request_id)
            ctx.status, ctx.error_type = 500, "internal_error"
            failure = internal_error(request_id)
            await _answer_failure(send, surface, request_id, failure, started=state["started"], done=state["done"])
        finally:
            if watcher is not None:
                watcher.cancel()
            elif channel is not None:
                channel.when_lost(None)
            try:
                await gateway.finished(ctx, cancelled=cancelled)
            except Exception:
                log.exception("request %s: settling failed", request_id)


async def _answer_failure(
    send: Send, surface: Surface, request_id: str, err: GatewayError, *, started: bool, done: bool, end: bytes = b""
) -> None:
    """The error in the envelope, or the surface's error event to end a stream already under way."""
    try:
        if not started:
            await send_reply(send, _plain_error(surface, err, request_id), lambda: None)
        elif not done:
            await send({"type": "http.response.body", "body": surface.stream_error(err) + end, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        pass  # the client is gone: nothing left to tell it


async def _tenant_id(gateway: Gateway, headers: dict[str, str]) -> str | None:
    """Who sent a body refused before the tenancy stage, for the log line (None: no valid key)."""
    try:
        tenant = await gateway.registry.resolve(headers.get("authorization"), headers.get(API_KEY))
    except GatewayError:
        return None
    return tenant.id


def _plain_error(surface: Surface, err: GatewayError, request_id: str) -> Reply:
    headers = {"content-type": "application/json", REQUEST_ID: request_id, **err.headers}
    return Reply(err.status, headers, surface.error_body(err))
