"""A pipelined request whose body never completes is cut within its body deadline, counted from its turn (it is
not read while the request ahead of it runs)."""

from __future__ import annotations

import asyncio
import time

import orjson

from tests.api.test_slow_clients import CHAT, closed_after, serve_guarded

DEADLINE_S = 1.0
BOUND_S = 15.0  # an upper bound for a loaded machine, not a measurement


def request(path: bytes, body: bytes, declared: int | None = None) -> bytes:
    length = len(body) if declared is None else declared
    return (b"POST " + path + b" HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % length + body)


def test_a_pipelined_request_with_a_stalled_body_is_closed() -> None:
    with serve_guarded(body_timeout_s=DEADLINE_S, keepalive_timeout_s=60) as url:
        port = int(url.rsplit(":", 1)[1])

        async def run() -> tuple[float, bytes]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            first = request(b"/v1/chat/completions", orjson.dumps(CHAT))
            # The second is for a path without the inference endpoints' own body deadline: only the server's.
            stalled = request(b"/admin/tenants/acme/keys", b'{"na', declared=1000)
            writer.write(first + stalled)
            await writer.drain()
            try:
                return await closed_after(reader, time.monotonic(), BOUND_S)
            finally:
                writer.close()

        took, sent = asyncio.run(run())
        print(f"pipelined request with a stalled body: closed {took:.1f} s after it was sent (body deadline "
              f"{DEADLINE_S:g} s)")
        # The first request's answer; the second's (the admin API refuses it before reading the body), then the
        # close at the body deadline (before: the socket stayed open as long as the client kept it).
        assert sent.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 401 " in sent
        assert took < BOUND_S
