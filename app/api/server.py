"""The HTTP server around the gateway app: uvicorn's httptools protocol with deadlines for slow clients, a cap on
connections per client address, and a drain on SIGTERM.

uvicorn bounds idle keep-alive connections (`timeout_keep_alive`) but not a request in progress: a client that
connects and sends half its headers, or declares Content-Length 1000 and sends 10 bytes, would hold its socket
forever. The protocol below arms a timer from the connection (or the next request's first byte) until the
headers are complete, and from then until the body is complete; a timer that fires closes the socket and
counts it. The inference endpoints answer a late body with a 408 in their envelope first (`app/api/proxy.py`);
the protocol's body timer, a little later, is the backstop for every other path.

Headers are bounded too (`listen.max_header_bytes`, `listen.max_header_count`: a 431 in the API's envelope), and
malformed HTTP gets a 400 in the envelope rather than uvicorn's text/plain: the protocol's base,
app/api/header_bounds.py.

Behind a load balancer every client arrives from its address: with `listen.trusted_proxies`, a connection from
one of them counts against the client its forwarded-for header names (app/api/client_address.py).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, ClassVar, Literal, Protocol

import uvicorn
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.client_address import ClientAddresses
from app.api.header_bounds import HeaderBounds, envelope, raw_response
from app.api.request_channel import KEY, RequestChannel, channel_of
from app.api.response_head import HeadCycle
from app.config.listen import Listen

Phase = Literal["header", "body", "write"]
# The protocol's body timer fires this much after the endpoint's own deadline, which answers with a 408 first.
BODY_BACKSTOP_S = 1.0


@dataclass(slots=True)
class ConnectionStats:
    """What the connection guard did, for /metrics."""

    header_timeouts: int = 0
    body_timeouts: int = 0
    write_timeouts: int = 0
    refused: int = 0
    open: int = 0
    headers_too_large: int = 0

    def timed_out(self, phase: Phase) -> None:
        """Count one socket closed (or answered 408) because its headers or body came too late, or because the
        client stopped reading its response."""
        if phase == "header":
            self.header_timeouts += 1
        elif phase == "body":
            self.body_timeouts += 1
        else:
            self.write_timeouts += 1


@dataclass(slots=True)
class ConnectionGuard:
    """Per-server state of the protocol: the deadlines, the open connections per client address, the counters."""

    header_timeout_s: float
    body_timeout_s: float
    max_per_client: int
    write_timeout_s: float = 30.0
    max_header_bytes: int = 64 * 1024
    max_header_count: int = 128
    addresses: ClientAddresses = field(default_factory=ClientAddresses)
    stats: ConnectionStats = field(default_factory=ConnectionStats)
    per_client: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_listen(cls, listen: Listen) -> ConnectionGuard:
        """The guard the `listen` section configures."""
        return cls(
            listen.header_timeout_s, listen.body_timeout_s, listen.max_connections_per_client,
            write_timeout_s=listen.write_timeout_s, max_header_bytes=listen.max_header_bytes,
            max_header_count=listen.max_header_count, addresses=ClientAddresses.from_listen(listen),
        )

    def admit(self, peer: str) -> bool:
        """Take one connection slot of `peer`; False (and nothing taken) when it holds all of them."""
        held = self.per_client.get(peer, 0)
        if held >= self.max_per_client:
            self.stats.refused += 1
            return False
        self.per_client[peer] = held + 1
        self.stats.open += 1
        return True

    def leave(self, peer: str) -> None:
        """Give `peer`'s slot back."""
        held = self.per_client.get(peer, 0) - 1
        if held > 0:
            self.per_client[peer] = held
        else:
            self.per_client.pop(peer, None)
        self.stats.open -= 1


def register_connection_metrics(meter: Meter, stats: ConnectionStats) -> None:
    """Observable instruments read from the counters at each collection (nothing on the request path)."""

    def timeouts(options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.header_timeouts, {"phase": "header"})
        yield Observation(stats.body_timeouts, {"phase": "body"})
        yield Observation(stats.write_timeouts, {"phase": "write"})

    meter.create_observable_counter(
        "gateway.connections.timed_out", [timeouts], "{connection}",
        "Client connections closed (or answered 408) because headers or body did not arrive in time, or the "
        "client did not read its response (phase write)",
    )
    meter.create_observable_counter(
        "gateway.connections.refused", [lambda o: [Observation(stats.refused)]], "{connection}",
        "Connections answered 503 because their client address held listen.max_connections_per_client",
    )
    meter.create_observable_counter(
        "gateway.connections.headers_too_large", [lambda o: [Observation(stats.headers_too_large)]], "{connection}",
        "Connections answered 431 because their headers passed listen.max_header_bytes or max_header_count",
    )
    meter.create_observable_gauge(
        "gateway.connections.open", [lambda o: [Observation(stats.open)]], "{connection}",
        "Client connections open now",
    )


async def _refuse(scope: Scope, receive: Receive, send: Send) -> None:
    """The app a refused connection gets: one 503 in its API's envelope, then the connection closes."""
    body = envelope(scope.get("raw_path", b""), 503, "Too many open connections from this address.",
                     "service_unavailable", "too_many_connections")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), (b"retry-after", b"1")]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _GuardedBase(HeaderBounds):
    """uvicorn's httptools protocol with header and body deadlines and the per-client cap (see the module doc)."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._peer: str | None = None
        self._got_bytes = False
        self._gateway_app = self.app
        self._via_proxy = False
        self._queued_body = False  # a pipelined request whose body was not complete when it was queued
        # A deadline the parser callbacks asked for, armed once the read is parsed: most requests arrive whole in
        # one read, and a timer armed and cancelled within it (two per request) would cost for nothing.
        self._due: Phase | None = None
        self._parsing: RequestChannel | None = None  # the channel of the request whose bytes are being parsed
        self._running: RequestChannel | None = None  # the channel of the request whose app runs (one at a time)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Count the connection against its client address and start the header deadline."""
        super().connection_made(transport)
        peer = self.client[0] if self.client else ""
        if self.guard.addresses.trusts(peer):
            self._via_proxy = True  # counted per forwarded client, once each request's headers are in
        elif self.guard.admit(peer):
            self._peer = peer
        else:
            self.app = _refuse  # answered once its headers are in, then closed
        self._arm(self.guard.header_timeout_s, "header")

    def connection_lost(self, exc: Exception | None) -> None:
        """Give the client's slot back."""
        self._disarm()
        self._write_resumed()
        if self._running is not None:
            self._running.connection_lost()
        if self._peer is not None:
            self.guard.leave(self._peer)
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser (whose callbacks move the deadlines and count header bytes)."""
        self._got_bytes = True
        super().data_received(data)
        self._bound_open_head(len(data))
        if self._due is not None:
            due, self._due = self._due, None
            if not self.transport.is_closing():
                self._arm(self.guard.header_timeout_s if due == "header" else self.guard.body_timeout_s
                          + BODY_BACKSTOP_S, due)

    def on_message_begin(self) -> None:
        """A request's first byte: its headers are due (the connection's own deadline if still running)."""
        super().on_message_begin()
        self._start_head()
        if self._timer is None:
            self._due = "header"  # armed after this read unless the headers complete within it

    def on_headers_complete(self) -> None:
        """Headers in time: the body is due next."""
        self._disarm()
        self._end_head()
        if self._via_proxy:
            self._admit_forwarded()
        self._parsing = RequestChannel()
        self.scope["extensions"] = {KEY: self._parsing}  # type: ignore[dict-item]
        super().on_headers_complete()
        if not self.pipeline:  # a queued (pipelined) request is not read until its turn: on_response_complete
            self._due = "body"  # armed after this read unless the body completes within it
        else:
            self._due = None
            self._queued_body = True

    def on_message_complete(self) -> None:
        """The whole request arrived: no deadline while the app works (keep-alive idling is uvicorn's)."""
        self._disarm()
        self._due = None
        self._queued_body = False
        if self._parsing is not None:
            self._parsing.body_complete = True
            self._parsing = None
        super().on_message_complete()
        self._in_head = True  # the next bytes on this connection are the next request's headers

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """uvicorn starts a request's app (at once, or a pipelined one when the previous response is out): its
        channel is the one a lost connection tells, and its cycle writes the head (app/api/response_head.py)."""
        self._running = channel_of(cycle.scope)
        cycle.__class__ = HeadCycle  # uvicorn builds its own cycle; this one writes the response head cheaper
        super()._start_asgi_task(cycle, app)

    # -- forwarded-for (see the module doc) ------------------------------------------------------------
    def _admit_forwarded(self) -> None:
        """A request through a trusted proxy: hold a slot of the client its forwarded-for header names."""
        client = self.guard.addresses.client_of(self.client[0] if self.client else "", self.headers)
        if client == self._peer:
            return
        if self._peer is not None:
            self.guard.leave(self._peer)
            self._peer = None
        if self.guard.admit(client):
            self._peer = client
            self.app = self._gateway_app
        else:
            self.app = _refuse

    def on_response_complete(self) -> None:
        """A response went out; a pipelined request whose body is still due starts its body deadline now."""
        super().on_response_complete()
        if self._queued_body and not self.pipeline and not self.transport.is_closing():
            self._queued_body = False
            self._arm(self.guard.body_timeout_s + BODY_BACKSTOP_S, "body")

    def pause_writing(self) -> None:
        """The client stopped reading (the send buffer is over its high-water mark): its response is due to drain
        within write_timeout_s, or the connection is cut (the app sees a disconnect: upstream aborted, slot freed)."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.guard.write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        """The client reads again."""
        super().resume_writing()
        self._write_resumed()

    def _write_resumed(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_expired(self) -> None:
        self._write_timer = None
        if self.transport.is_closing():
            return
        self.guard.stats.timed_out("write")
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.abort()  # close() would wait for the buffer the client never reads

    def _arm(self, seconds: float, phase: Phase) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired, phase)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, phase: Phase) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if phase == "body" and self.cycle is not None and self.cycle.response_started:
            # The app answered (a 408, a 413, …) and closes the connection itself when it is done.
            if self.cycle.response_complete:
                self.transport.close()
            return
        self.guard.stats.timed_out(phase)
        if phase == "header" and self._got_bytes:
            message = f"The request headers did not arrive within {self.guard.header_timeout_s:g} s."
            body = envelope(getattr(self, "url", b""), 408, message, "invalid_request_error", "request_timeout")
            self.transport.write(raw_response(408, b"Request Timeout", body))
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()


def guarded_protocol(guard: ConnectionGuard) -> type[HttpToolsProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` bound to one server's guard."""
    return type("GuardedHttpToolsProtocol", (_GuardedBase,), {"guard": guard})


class Drainable(Protocol):
    """What the server tells the app when a drain starts (GatewayApp: /ready turns 503)."""

    def begin_drain(self) -> None:
        """Report not-ready from now on."""
        ...


def server_config(app: Any, listen: Listen, guard: ConnectionGuard, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's config for the gateway: the guarded protocol, keep-alive and drain limits from `listen`."""
    kwargs.setdefault("host", listen.host)
    kwargs.setdefault("port", listen.port)
    return uvicorn.Config(
        app,
        http=guarded_protocol(guard),
        timeout_keep_alive=listen.keepalive_timeout_s,  # type: ignore[arg-type]  # a float works (call_later)
        timeout_graceful_shutdown=listen.drain_s,  # type: ignore[arg-type]
        **kwargs,
    )


class GatewayServer(uvicorn.Server):
    """uvicorn's server with the drain: on SIGTERM the app reports not-ready at once, the listener stays open
    `drain_notice_s` more, then stops accepting; open requests have until `drain_s` after the signal."""

    def __init__(self, config: uvicorn.Config, app: Drainable, listen: Listen) -> None:
        super().__init__(config)
        self._drainable = app
        self._listen = listen
        self._drain_from: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First SIGTERM: drain (notice first); SIGINT, or a second signal: as uvicorn does."""
        if self._drain_from is None:
            self._drain_from = time.monotonic()
            self._drainable.begin_drain()
            if sig == signal.SIGTERM and self._listen.drain_notice_s > 0:
                return  # on_tick ends the main loop when the notice is over
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick, plus the end of the drain notice."""
        if await super().on_tick(counter):
            return True
        return self._drain_from is not None and time.monotonic() - self._drain_from >= self._listen.drain_notice_s

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        """Stop accepting and wait for open requests, up to drain_s after the signal."""
        if self._drain_from is not None:
            left = self._listen.drain_s - (time.monotonic() - self._drain_from)
            self.config.timeout_graceful_shutdown = max(0.1, left)  # type: ignore[assignment]
        await super().shutdown(sockets)
