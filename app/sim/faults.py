"""Injected faults: a body that carries `SimOptions.fail_marker` is answered 500, every time, on every route.

A deterministic per-body engine failure is what a poisoned request looks like from the gateway (the same body
failing the same way on every replica); the fault suite (tests/faults/) sends such bodies to check that they cost
the sender, not the replicas' breakers. Only POSTs are read; the body is replayed to the app unchanged.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.sim.state import JSON_HEADER, send_whole

FAULT_BODY = (b'{"error":{"message":"injected fault (--fail-marker)","type":"InternalServerError","param":null,'
              b'"code":500}}')


class FailMarker:
    """ASGI middleware: a POST whose body contains `marker` gets vLLM's 500 envelope; others pass through."""

    def __init__(self, app: ASGIApp, marker: str) -> None:
        self.app = app
        self.marker = marker.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read a POST's body, answer 500 when it carries the marker, else replay it to the app."""
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        body = b"".join(m.get("body", b"") for m in messages)
        if self.marker in body:
            await send_whole(send, 500, FAULT_BODY, [JSON_HEADER])
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
