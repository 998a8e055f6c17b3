"""The stream relay: an upstream SSE stream event by event through the surface's observer, to the client.

It owns the attempt's lease (one verdict per replica), continues a stream on another replica when its
replica fails midway (through the dispatcher's `migrate` and the surface's migration,
app/surfaces/<api>/migration.py),
and bills what was delivered when a stream ends without its usage.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from app.context import RequestContext
from app.errors import GatewayError, upstream_unreachable
from app.surfaces.base import StreamObserver
from app.surfaces.chat.migration import delivered as chat_delivered
from app.surfaces.migration import Delivered, Migration, Splicer
from app.upstream import UpstreamResponse, sse_events

if TYPE_CHECKING:
    from app.routing.lease import Lease


class Continued(NamedTuple):
    """A continuation stream that took over: its response, lease, observer and splice."""

    resp: UpstreamResponse
    lease: Lease
    observer: StreamObserver
    splice: Splicer


Migrate = Callable[[RequestContext, Migration, Delivered], Awaitable[Continued | None]]


class StreamRelay:
    """An upstream SSE stream relayed through the surface's observer; the current attempt's lease ends with it."""

    def __init__(
        self,
        ctx: RequestContext,
        resp: UpstreamResponse,
        lease: Lease,
        observer: StreamObserver,
        *,
        migrate: Migrate | None = None,
        migration: Migration | None = None,
        max_migrations: int = 0,
    ) -> None:
        self.ctx = ctx
        self.observer = observer
        self._resp = resp
        self._lease = lease
        self._migrate = migrate if max_migrations > 0 and migration is not None else None
        self._migration = migration
        self._max_migrations = max_migrations
        # What the client was sent, kept only where a migration or reply learning (ctx.blocks) reads it back.
        self._journal: list[bytes] | None = [] if self._migrate is not None or ctx.blocks is not None else None
        if ctx.blocks is not None:
            ctx.reply = self.reply_message

    async def events(self) -> AsyncGenerator[bytes, None]:
        """Relayed bytes; a failure midway migrates or ends with the surface's error event. Close with aclose()."""
        ctx = self.ctx
        splice: Splicer | None = None
        clean = failed = False
        watched = ctx.queue_ticket  # told once when the first token passes (the admission's prefill gate)
        try:
            while True:
                observer, replica = self.observer, self._lease.replica
                try:
                    async for batch in sse_events(self._resp.chunks()):
                        if splice is not None:
                            batch = [e for event in batch for e in splice.rewrite(event)]
                        out = [kept for event in batch if (kept := observer.observe(event)) is not None]
                        if ctx.timing.first_token and not replica.ttft_ewma_s:
                            replica.on_first_token(ctx.timing.first_token - ctx.timing.upstream_start)
                        if watched is not None and ctx.timing.first_token:
                            watched.first_token()
                            watched = None
                        if out:
                            if self._journal is not None:
                                self._journal.extend(out)
                            yield b"".join(out)
                    if not observer.done:
                        raise upstream_unreachable("upstream closed the stream before its final event", "protocol")
                    clean = True
                    break
                except GatewayError as err:
                    self._lease.fail(err.failure or "protocol")
                    self._resp.close()
                    taken = await self._continue(err)
                    if taken is None:
                        failed = True
                        ctx.error_type = err.code or err.type
                        yield ctx.surface.stream_error(err)
                        break
                    self._resp, self._lease, self.observer, splice = taken
        finally:
            ctx.timing.end = ctx.timing.end or time.perf_counter()
            ctx.timing.upstream_busy = ctx.timing.end - ctx.timing.upstream_start
            if clean:
                self._resp.release()
                self._lease.succeed()
            elif not failed:  # the client went away (a failed attempt closed its response already)
                self._resp.close()
                self._lease.release()
                ctx.error_type = ctx.error_type or "client_disconnected"
            if not ctx.usage.reported:
                self._bill_delivered()

    def reply_message(self) -> dict[str, Any] | None:
        """The assistant message the client got, if the stream finished with text (not a tool call)."""
        got = chat_delivered(self._journal or ())  # only chat bodies are hashed
        return {"role": "assistant", "content": got.text} if got.finished and not got.tool_call else None

    async def _continue(self, err: GatewayError) -> Continued | None:
        ctx = self.ctx
        if self._migrate is None or self._migration is None or self._journal is None:
            return None
        got = self._migration.delivered(self._journal)
        why = "max_migrations" if ctx.migrations >= self._max_migrations else None
        why = why or self._migration.not_migratable(ctx.body, got)
        if why is not None:
            ctx.migration_outcomes.append(why)
            return None
        return await self._migrate(ctx, self._migration, got)

    def _bill_delivered(self) -> None:
        # No usage arrived (the stream was cut): charge the prompt's estimate and the output relayed. After a
        # kv_events pick the prompt count is exact and its predicted cache hit is billed at the cached price.
        ctx = self.ctx
        # The journal kept only for reply learning does not count: that stream never migrated.
        journal, migration = (self._journal, self._migration) if self._migrate is not None else (None, None)
        chunks = migration.delivered(journal).chunks if journal and migration else self.observer.delivered
        if chunks or ctx.upstream_called:
            est = ctx.call_estimate
            if not ctx.usage.prompt_tokens:  # a stream that stated its prompt first (message_start) keeps it
                ctx.usage.prompt_tokens = est.prompt_tokens if est is not None else ctx.estimated_input_tokens
                ctx.usage.cached_tokens = est.cached_tokens if est is not None else 0
            ctx.usage.completion_tokens = chunks
            ctx.usage.reported = True
            ctx.usage_estimated = True
