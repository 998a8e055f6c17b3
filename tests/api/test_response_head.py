"""The guarded server's response head (app/api/response_head.py) writes exactly uvicorn's bytes, with uvicorn's
framing state and errors, for every kind of head the gateway sends."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.api.response_head import HeadCycle

DEFAULTS = [(b"date", b"Thu, 03 Dec 2026 10:00:00 GMT"), (b"server", b"uvicorn")]


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Flow:
    write_paused = False


def cycle(kind: type[RequestResponseCycle], method: str, keep_alive: bool) -> tuple[RequestResponseCycle, Transport]:
    transport = Transport()
    scope: Any = {"method": method, "type": "http"}
    logger = logging.getLogger("test")
    made = kind(scope=scope, transport=transport, flow=Flow(), logger=logger,  # type: ignore[arg-type]
                access_logger=logger, access_log=False, default_headers=DEFAULTS, message_event=asyncio.Event(),
                expect_100_continue=False, keep_alive=keep_alive, on_response=lambda: None)
    return made, transport


def framing(c: RequestResponseCycle) -> tuple[Any, ...]:
    return (c.response_started, c.chunked_encoding, c.expected_content_length, c.keep_alive)


HEADS = [
    (200, [(b"content-type", b"application/json"), (b"x-request-id", b"abc"), (b"content-length", b"12")]),
    (200, [(b"content-type", b"text/event-stream"), (b"x-kvgate-route", b"pool=a;class=interactive")]),
    (429, [(b"Retry-After", b"3"), (b"content-length", b"2"), (b"x-kvgate-limit", b"rpm")]),
    (408, [(b"connection", b"Keep-Alive, Close"), (b"content-length", b"0")]),
    (200, [(b"transfer-encoding", b"Chunked"), (b"x-value", b"tab\tinside")]),
    (204, []),
]


@pytest.mark.parametrize(("status", "headers"), HEADS)
@pytest.mark.parametrize("method", ["POST", "HEAD"])
@pytest.mark.parametrize("keep_alive", [True, False])
def test_the_head_and_framing_state_are_uvicorns(status: int, headers: list[tuple[bytes, bytes]], method: str,
                                                  keep_alive: bool) -> None:
    message = {"type": "http.response.start", "status": status, "headers": headers}
    theirs, their_transport = cycle(RequestResponseCycle, method, keep_alive)
    ours, our_transport = cycle(HeadCycle, method, keep_alive)
    asyncio.run(theirs.send(message))  # type: ignore[arg-type]
    asyncio.run(ours.send(message))
    assert our_transport.written == their_transport.written
    assert framing(ours) == framing(theirs)


@pytest.mark.parametrize(("name", "value", "error"), [
    (b"x-bad name", b"v", "Invalid HTTP header name."),
    (b"x-ok", b"line\r\ninjected: 1", "Invalid HTTP header value."),
])
def test_an_invalid_header_fails_the_response_as_uvicorn_does(name: bytes, value: bytes, error: str) -> None:
    message = {"type": "http.response.start", "status": 200, "headers": [(b"x-first", b"ok"), (name, value)]}
    ours, transport = cycle(HeadCycle, "POST", True)
    with pytest.raises(RuntimeError, match=error):
        asyncio.run(ours.send(message))
    assert transport.written == [] and ours.response_started


def test_the_body_after_the_head_is_uvicorns() -> None:
    ours, transport = cycle(HeadCycle, "POST", True)
    asyncio.run(ours.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}))
    asyncio.run(ours.send({"type": "http.response.body", "body": b"ok", "more_body": False}))
    assert transport.written[-1] == b"ok" and ours.response_complete
