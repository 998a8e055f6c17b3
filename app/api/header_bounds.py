"""Header bounds and parse errors for uvicorn's httptools protocol (the base of app/api/server.py's protocol).

httptools keeps a header's bytes until the header ends, without a limit (24 connections sending 100 MiB headers took
the process from 109 to 1,026 MiB RSS): past `listen.max_header_bytes` (URL and headers) or `max_header_count` the
request gets a 431 in its API's envelope and the connection is closed; a header block still open is cut once it
holds the limit plus one read. uvicorn answers bytes it cannot parse with a text/plain 400: here, the envelope.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.errors import error_body

# A read's worth of bytes (uvloop and asyncio read up to 256 KiB at a time): a header block still open after a
# read counts all of that read, which may have begun with the previous request's body.
READ_SLACK = 256 * 1024


class Limits(Protocol):
    """What the bounds read of the server's guard."""

    max_header_bytes: int
    max_header_count: int
    stats: Any  # ConnectionStats: counts headers_too_large


def raw_response(status: int, reason: bytes, body: bytes) -> bytes:
    """A whole JSON response written straight to the socket (then closed), for answers before the app runs."""
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason, len(body)) + body)


def envelope(path: bytes, status: int, message: str, kind: str, code: str) -> bytes:
    """The error body in the envelope of the API the (possibly partial) path belongs to."""
    if path.startswith(b"/v1/messages"):
        anthropic_type = "api_error" if status >= 500 else "invalid_request_error"
        if status == 408:
            anthropic_type = "timeout_error"
        return orjson.dumps({"type": "error", "error": {"type": anthropic_type, "message": message}})
    return error_body(message, kind, None, code)


class _HeadersTooLarge(Exception):
    """Raised in a parser callback: httptools stops and uvicorn calls send_400_response (answered 431)."""


class HeaderBounds(HttpToolsProtocol):
    """httptools' protocol counting each request's header bytes and headers, answering parse errors in the envelope.

    The subclass calls `_start_head` when a request begins, `_end_head` when its headers are complete, and
    `_bound_open_head` after each read.
    """

    guard: ClassVar[Any]  # the server's ConnectionGuard (a Limits), set on the protocol class

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0  # exact: URL and completed headers
        self._head_raw = 0  # bytes read while a header block stays open (an upper bound of what httptools holds)
        self._head_count = 0
        self._too_large: str | None = None
        # The guard's bounds, read once per connection: the header callbacks run per header of every request.
        self._max_bytes: int = self.guard.max_header_bytes
        self._max_count: int = self.guard.max_header_count

    def on_url(self, url: bytes) -> None:
        """Count the URL against the header bytes."""
        self._head_bytes += len(url)
        if self._head_bytes > self._max_bytes:
            self._over_bounds()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count one header against the header bytes and count, then do what uvicorn's `on_header` does (its three
        lines inline: this runs for every header of every request, and a call per header was 7 of the Python
        calls per request the bounds cost; uvicorn is pinned to the minor, and a test compares the two)."""
        self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        self._head_count += 1
        if self._head_bytes > self._max_bytes or self._head_count > self._max_count:
            self._over_bounds()
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def _start_head(self) -> None:
        self._in_head = True
        self._head_bytes = self._head_raw = self._head_count = 0

    def _end_head(self) -> None:
        self._in_head = False

    def _over_bounds(self) -> None:
        """The head passed a bound: say which, and stop the parser (answered 431 by send_400_response)."""
        if self._head_bytes > self._max_bytes:
            self._too_large = f"The request headers exceed {self._max_bytes} bytes."
        else:
            self._too_large = f"The request has more than {self._max_count} headers."
        raise _HeadersTooLarge

    def _bound_open_head(self, size: int) -> None:
        """After a read: a header block still open must not grow past the limit plus a read."""
        if not self._in_head or self.transport.is_closing():
            return
        self._head_raw += size
        if self._head_raw > self._max_bytes + READ_SLACK:
            self._too_large = f"The request headers exceed {self._max_bytes} bytes."
            self.send_400_response(self._too_large)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes it cannot parse, in the API's envelope: 431 for headers over the bounds."""
        if self.transport.is_closing():
            return
        path = getattr(self, "url", b"") or b""
        if self._too_large is not None:
            self.guard.stats.headers_too_large += 1
            body = envelope(path, 431, self._too_large, "invalid_request_error", "request_headers_too_large")
            self.transport.write(raw_response(431, b"Request Header Fields Too Large", body))
        else:
            message = "The request is not valid HTTP/1.1 and could not be parsed."
            body = envelope(path, 400, message, "invalid_request_error", "invalid_http")
            self.transport.write(raw_response(400, b"Bad Request", body))
        self.transport.close()
