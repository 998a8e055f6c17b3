"""The gateway's admission step: one fair queue per pool that enables it, what a request is charged, the 429.

The FairAdmission hook (app/admission/hook.py, at `before_pick`) acquires a ticket from the queue of the class's
home pool (`build_queues` made them; `predicted_tokens` is the charge when the pool is capped or busy, none is
made below saturation; `queue_error` the 429) and stores it on the RequestContext; the settle stage hands it back
through `settle_ticket` exactly once, with the actual cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from app.admission.queue import AdmissionQueue, AdmissionRejected, Ticket
from app.config.admission import AdmissionConfig
from app.context import RequestContext
from app.errors import GatewayError
from app.headers import LIMIT, RETRY_AFTER
from app.limits import max_output_tokens

QUEUE_REASON = "queue"  # x-kvgate-limit `rejected:queue`, and the limit label in telemetry


def build_queues(admission: Mapping[str, AdmissionConfig]) -> dict[str, AdmissionQueue]:
    """One queue per pool whose admission is not off (off: no step, no cost); unset engages with a second tenant."""
    return {name: AdmissionQueue(cfg, pool=name) for name, cfg in admission.items() if cfg.enabled is not False}


def predicted_tokens(ctx: RequestContext) -> int:
    """What the request will cost the pool: uncached prompt (estimate less the route's predicted cache hit,
    when a route is known) plus its output cap."""
    route = ctx.route
    cached = route.cached_tokens if route is not None and route.cached_tokens is not None else 0
    prompt = ctx.estimated_input_tokens - cached
    return (prompt if prompt > 0 else 0) + max_output_tokens(ctx.body, ctx.surface.output_cap_fields)


def settle_ticket(ctx: RequestContext) -> None:
    """Free the slot with what the request did cost (uncached prompt + output; 0 if it never reached an engine;
    unknown: the prediction stands, made now for a start below saturation, which predicted nothing). Safe to
    call on every path (the ticket is released once)."""
    ticket = ctx.queue_ticket
    if ticket is None:
        return
    usage = ctx.usage
    if usage.reported:
        ticket.release(usage.uncached_tokens + usage.completion_tokens)
    elif not ctx.upstream_called:
        ticket.release(0)  # never reached an engine: nothing to charge
    elif ticket.predicted_tokens:
        ticket.release()
    else:
        ticket.release(predicted_tokens(ctx))


def queue_error(err: AdmissionRejected, tenant_id: str) -> GatewayError:
    """429 in OpenAI's rate-limit shape, Retry-After in whole seconds (at least 1), x-kvgate-limit rejected:queue."""
    retry = max(1, math.ceil(err.retry_after_s))
    why = "the pool's admission queue is full" if err.reason == "queue_full" else "no slot within the class deadline"
    return GatewayError(
        429,
        f"The pool is saturated and {why} for tenant {tenant_id}. Please try again in {retry}s.",
        type="requests",
        code="rate_limit_exceeded",
        headers={RETRY_AFTER: str(retry), LIMIT: f"rejected:{QUEUE_REASON}"},
        reason=QUEUE_REASON,
    )


def route_suffix(ticket: Ticket | None) -> str:
    """`;queued=<ms>` for x-kvgate-route when the request waited in the queue, else ''."""
    if ticket is None or not ticket.queued:
        return ""
    return f";queued={ticket.waited_s * 1000.0:.0f}"


# vLLM runs lower values first; class priorities are 0 (interactive) and 10 (bulk): a step below the next class.
OVER_SHARE_STEP = 5


def fair_priority(class_priority: int | None, ticket: Ticket | None) -> int | None:
    """The `priority` to send: the class's, pushed back a step when the tenant started over its fair share
    (None stays None: the pool does not schedule by priority)."""
    if class_priority is None or ticket is None or not ticket.over_share:
        return class_priority
    return class_priority + OVER_SHARE_STEP
