"""The fair admission queue as a path hook: before pick, a request takes a slot of its pool's queue (waiting only
while that pool is saturated), or is refused with the queue's 429, or (on_exceed degrade) served as bulk.

Registered only where some pool has a queue (`pools.<p>.admission`); the scraper's rounds feed each queue's view
of its pool's saturation through `on_scrape`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from app.admission.queue import AdmissionQueue, AdmissionRejected
from app.admission.step import predicted_tokens, queue_error
from app.hooks import PathHook
from app.routing.classify import classify
from app.routing.spill import cached_home_and_other

if TYPE_CHECKING:
    from app.config import ModelConfig, RoutingConfig
    from app.config.admission import RouteClass
    from app.context import RequestContext
    from app.routing.state import ClusterState, ReplicaState
    from app.telemetry import Telemetry


class FairAdmission(PathHook):
    """Holds a slot of the request's pool on the context (settle releases it), or raises the queue's 429."""

    name = "fair_admission"

    def __init__(self, queues: Mapping[str, AdmissionQueue], cluster: Callable[[], ClusterState],
                 routing: RoutingConfig, telemetry: Telemetry) -> None:
        self.queues = queues
        self._cluster = cluster
        self._routing = routing
        self._telemetry = telemetry
        self._zero_wait = telemetry.queue_wait_zeros()  # a fast start's 0 s wait, counted in one call
        # class -> model name -> the queue of its home pool (None: that pool has none): two lookups per request
        # (cached_home_and_other and the queue by pool name were three calls, a key tuple and three lookups).
        # Pools and roles come from the config; a rediscovery rebuilds the cluster (a new memo), and the next
        # scrape of it clears this table anyway.
        self._homes: dict[str, dict[str, AdmissionQueue | None]] = {}
        self._homes_of: object = None

    def before_pick(self, ctx: RequestContext, model: ModelConfig) -> Awaitable[None] | None:
        """A slot of the class's home pool (or the pinned one): below saturation at once (nothing to await),
        else what `_queued` waits for."""
        assert ctx.route_class is not None and ctx.tenant is not None
        rclass = ctx.route_class.route_class
        if ctx.pinned is not None:
            queue = self.queues.get(ctx.pinned[0])
        else:
            try:
                queue = self._homes[rclass][model.name]
            except KeyError:
                queue = self._home_queue(model, rclass)
        if queue is None:
            return None
        tenant = ctx.tenant.id
        ticket = queue.start_now(tenant, rclass)
        if ticket is None:
            return self._queued(ctx, model)
        ctx.queue_ticket = ticket
        self._zero_wait((queue.pool, tenant, rclass))
        return None

    async def _queued(self, ctx: RequestContext, model: ModelConfig) -> None:
        """Wait for a slot; a refused interactive request with on_exceed degrade is re-classified bulk and
        queued again (its pool, its queue)."""
        assert ctx.route_class is not None and ctx.tenant is not None
        tenant = ctx.tenant
        while True:
            rclass = ctx.route_class.route_class
            queue = self.queues.get(ctx.pinned[0]) if ctx.pinned is not None else self._home_queue(model, rclass)
            if queue is None:
                return
            pool = queue.pool
            # Below saturation the slot comes at once with no cost predicted (settle_ticket charges the actual).
            ticket = queue.start_now(tenant.id, rclass)
            if ticket is None:
                tokens = predicted_tokens(ctx)
                # queue.acquire without its coroutine: with room under the cap the ticket comes at once.
                ticket = queue.try_admit(tenant.id, rclass, tokens, watch_first_token=ctx.stream)
                try:
                    if ticket is None:
                        ticket = await queue.wait(tenant.id, rclass, tokens, watch_first_token=ctx.stream)
                except AdmissionRejected as err:
                    degrade = queue.cfg.on_exceed == "degrade" and rclass == "interactive" and ctx.pinned is None
                    self._telemetry.record_limited(ctx, "queue", "degrade" if degrade else "reject")
                    if not degrade:
                        raise queue_error(err, tenant.id) from None
                    ctx.limit_notes.append("degraded:queue")
                    ctx.route_class = classify(ctx.body, ctx.headers, tenant, self._routing, degraded=True,
                                               cap_fields=ctx.surface.output_cap_fields)
                    continue
            ctx.queue_ticket = ticket
            self._telemetry.record_queue_wait(pool, tenant.id, rclass, ticket.waited_s)
            return

    def _home_queue(self, model: ModelConfig, rclass: RouteClass) -> AdmissionQueue | None:
        """The queue of the class's home pool, remembered in `_homes`."""
        cluster = self._current(self._cluster())
        queue = self.queues.get(cached_home_and_other(model, rclass, cluster)[0].name)
        self._homes.setdefault(rclass, {})[model.name] = queue
        return queue

    def on_scrape(self, replica: ReplicaState) -> None:
        """After a replica's probe: its pool's queue re-assesses saturation (and may release waiters)."""
        queue = self.queues.get(replica.pool)
        pool = self._current(self._cluster()).pools.get(replica.pool)
        if queue is not None and pool is not None:
            queue.on_state_change(pool.candidates())

    def _current(self, cluster: ClusterState) -> ClusterState:
        """`cluster`, with `_homes` emptied if a rediscovery rebuilt it (its memo is new): home pools are looked
        up again."""
        if cluster.memo is not self._homes_of:
            self._homes_of, self._homes = cluster.memo, {}
        return cluster
