"""The upstream wire: one pooled aiohttp session, a request's response head, its body or its SSE events.

What the bytes mean (usage, finish reasons, model names) is the API surface's business (app/surfaces/);
which replica, how often and with what backoff is the dispatcher's (app/dispatch.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import aiohttp
import orjson

from app.config import UpstreamConfig
from app.errors import GatewayError, upstream_status, upstream_timeout, upstream_unreachable
from app.routing.load_report import RESPONSE_HEADER

# What is kept of a 5xx body: enough for the engine's error envelope (compared across replicas, answered).
ERROR_BODY_BYTES = 4096


def create_session(cfg: UpstreamConfig) -> aiohttp.ClientSession:
    """One pooled client session for all replicas; timeouts per the config."""
    connector = aiohttp.TCPConnector(
        limit=0,
        limit_per_host=cfg.max_connections_per_replica,
        keepalive_timeout=cfg.keepalive_timeout_s,
        enable_cleanup_closed=True,
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s)
    # auto_decompress off: bodies are relayed as sent, and vLLM does not compress anyway.
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, json_serialize=lambda o: orjson.dumps(o).decode()
    )


class UpstreamResponse(Protocol):
    """A response whose head has arrived: what the dispatcher and the relay need of it."""

    status: int
    content_type: str
    load_report: str | None  # vLLM's endpoint-load-metrics header, when the reply carries one

    async def body(self) -> bytes:
        """The whole body; GatewayError (with its failure kind) when the upstream breaks off."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive; GatewayError when the upstream breaks off."""
        ...

    def close(self) -> None:
        """Drop the connection (vLLM aborts an unfinished request)."""
        ...

    def release(self) -> None:
        """Return a finished connection to the pool."""
        ...


class Transport(Protocol):
    """Sends one request to one replica and waits for the response head."""

    async def send(
        self, replica: str, path: str, payload: bytes, headers: Mapping[str, str], *, idle_s: float | None = None
    ) -> UpstreamResponse:
        """POST payload to replica+path; GatewayError (failure kind set) before any byte of a head arrives,
        or for a 5xx head (read and released here: nothing of it reaches the client). `idle_s`: the longest
        silence allowed on the socket (head and every read after it), instead of upstream.read_timeout_s."""
        ...


def transport_error(err: BaseException, replica: str) -> GatewayError:
    """The gateway's error for a transport failure: 504 for timeouts, 502 otherwise."""
    if isinstance(err, TimeoutError | aiohttp.ServerTimeoutError):
        return upstream_timeout(f"upstream {replica} timed out")
    return upstream_unreachable(f"upstream {replica} unreachable: {type(err).__name__}")


class _AiohttpResponse:
    __slots__ = ("_replica", "_resp", "content_type", "load_report", "status")

    def __init__(self, resp: aiohttp.ClientResponse, replica: str) -> None:
        self._resp = resp
        self._replica = replica
        self.status = resp.status
        self.content_type = resp.headers.get("content-type", "application/json")
        self.load_report = resp.headers.get(RESPONSE_HEADER)

    async def body(self) -> bytes:
        try:
            return await self._resp.read()
        except (TimeoutError, aiohttp.ClientError) as err:
            self._resp.close()
            raise transport_error(err, self._replica) from err

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as err:
            raise transport_error(err, self._replica) from err

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()


class AiohttpTransport:
    """The production transport over one shared aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    async def send(
        self, replica: str, path: str, payload: bytes, headers: Mapping[str, str], *, idle_s: float | None = None
    ) -> UpstreamResponse:
        """POST and wait for the head; 5xx heads and transport errors become GatewayErrors."""
        # aiohttp's sock_read restarts with every read and pauses while the gateway stops reading (a slow
        # client): it is exactly "the replica sent nothing for idle_s".
        timeout = self._timeouts.get(idle_s) if idle_s is not None else None
        if idle_s is not None and timeout is None:
            base = self.session.timeout
            timeout = self._timeouts[idle_s] = aiohttp.ClientTimeout(sock_connect=base.sock_connect, sock_read=idle_s)
        try:
            resp = await self.session.post(replica + path, data=payload, headers=dict(headers),
                                           timeout=timeout or self.session.timeout)  # fmt: skip
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise transport_error(err, replica) from err
        if resp.status >= 500:
            body = b""
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                small = resp.content_length is not None and resp.content_length <= ERROR_BODY_BYTES
                body = await (resp.read() if small else resp.content.read(ERROR_BODY_BYTES))
            resp.release()  # a body left unread closes the connection instead of pooling it
            raise upstream_status(replica, resp.status, body)
        return _AiohttpResponse(resp, replica)


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """Complete SSE events (each ending in a blank line), batched per arriving network chunk."""
    buf = b""
    async for chunk in chunks:
        buf += chunk
        out: list[bytes] = []
        while True:
            cut = buf.find(b"\n\n")
            if cut < 0:
                break
            out.append(buf[: cut + 2])
            buf = buf[cut + 2 :]
        if out:
            yield out


def forward_headers(request_id: str) -> dict[str, str]:
    """Headers sent to vLLM: content type and request id (telemetry adds the trace context)."""
    return {"content-type": "application/json", "x-request-id": request_id}
