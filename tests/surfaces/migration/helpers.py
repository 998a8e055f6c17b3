"""What the per-surface migration tests share: a context for any surface, a transport that records requests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from app.context import ClassDecision, RequestContext
from app.dispatch import StreamRelay
from app.surfaces.base import Surface
from tests.test_dispatch import A, B, FakeResponse, FakeTransport, setup

TOKENIZE_3 = b'{"count":3,"max_model_len":2048,"tokens":[1,2,3]}'


class RecordingTransport(FakeTransport):
    """FakeTransport that also keeps each request's path and body."""

    def __init__(self, script: dict[str, list[Any]]) -> None:
        super().__init__(script)
        self.requests: list[tuple[str, str, dict[str, Any]]] = []

    async def send(self, replica: str, path: str, payload: bytes, headers: Mapping[str, str], **kw: Any) -> Any:
        self.requests.append((replica, path, orjson.loads(payload)))
        return await super().send(replica, path, payload, headers, **kw)


def surface_ctx(surface: Surface, path: str, body: dict[str, Any]) -> RequestContext:
    """A streaming request's context on `surface`, classified interactive."""
    c = RequestContext(request_id="r1", surface=surface, path=path, body=body, model="m", stream=True,
                       client_wants_usage=True, headers={}, prompt=surface.view(body))  # fmt: skip
    c.route_class = ClassDecision("interactive", "default")
    return c


def named_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of every named SSE event in a relayed stream."""
    out: list[tuple[str, dict[str, Any]]] = []
    for event in raw.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in event.split(b"\n") if b": " in line and line[:1] != b":")
        if b"event" in lines:
            out.append((lines[b"event"].decode(), orjson.loads(lines[b"data"])))
    return out


async def collect(relay: StreamRelay) -> bytes:
    """Everything the relay sends the client."""
    return b"".join([c async for c in relay.events()])


Migrated = tuple[list[tuple[str, dict[str, Any]]], RequestContext, RecordingTransport]


async def cut_and_continued(surface: Surface, path: str, body: dict[str, Any], first: list[bytes],
                            second: list[bytes]) -> Migrated:  # fmt: skip
    """A stream cut on A after `first`, continued on B with `second` (B's /tokenize counts 3 tokens delivered)."""
    d, _, _ = setup({})
    transport = RecordingTransport({A: [FakeResponse(chunks=first, fail_after=len(first))],
                                    B: [FakeResponse(body=TOKENIZE_3), FakeResponse(chunks=second)]})  # fmt: skip
    d.transport = transport
    c = surface_ctx(surface, path, body)
    relay = await d.run(c, d.cfg.models[0], 0)
    assert isinstance(relay, StreamRelay)
    return named_events(await collect(relay)), c, transport
