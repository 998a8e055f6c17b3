"""Limits: requests/min, tokens/min, concurrent requests and a monthly USD budget, per tenant.

One store round trip admits a request (all four checks, committed atomically only if all pass) and
one settles it (lease released, TPM corrected to actual tokens, spend recorded).

Token estimate (before the call): ceil(characters of message/prompt text / 4) + 4 per chat message
for role and framing; tools/functions count by their JSON length. The TPM window is charged that
estimate plus the output the request may produce (max_completion_tokens or max_tokens, times n),
capped at the tenant's tpm so one large request can still pass an idle window. Once a replica is picked,
`reserve_estimate` moves the reservation to the exact prompt count with the predicted cached tokens at
`tpm_cached_weight` (app/call_estimate.py), beside the upstream call; settle replaces the reservation with the
actual prompt (cached at the same weight) + completion tokens.

Over a limit: 429 with Retry-After in OpenAI's shape (type "requests" or "tokens", code
"rate_limit_exceeded"; budget: type "insufficient_quota", code "budget_exceeded"). With
`on_exceed: degrade` the request is served instead as bulk with max_tokens capped, and a note goes
to `ctx.limit_notes`. Degraded requests hold a concurrency slot but are not charged to the rpm/tpm
windows: they are the overflow, and the windows keep measuring the traffic served at full class.

Fail mode, when the store is unreachable: "open" serves the request unenforced (note
`unenforced:store_unavailable`), its spend buffered in the ledger and flushed later; "closed"
answers 503 (code "store_unavailable").
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from app.config import LimitsConfig
from app.context import Admission, RequestContext
from app.errors import GatewayError, store_unavailable
from app.headers import LIMIT, RETRY_AFTER
from app.ids import uuid4_hex
from app.prompt import CHARS_PER_TOKEN, PromptView
from app.spend import SpendLedger, spend_record
from app.store.base import MICROS_PER_USD, LimitReason, LimitSpec, Release, Store, StoreUnavailable

if TYPE_CHECKING:
    from app.records import CallEstimate

log = logging.getLogger(__name__)

# OpenAI's output caps, newest first; other surfaces pass their own (Responses: max_output_tokens).
OUTPUT_CAP_FIELDS = ("max_completion_tokens", "max_tokens")


def estimate_input_tokens(view: PromptView) -> int:
    """Prompt tokens a request will likely use, before any tokenizer runs (see module doc)."""
    return math.ceil((view.text_chars + view.tool_chars) / CHARS_PER_TOKEN) + view.framing_tokens


def tpm_tokens(prompt: int, cached: int, completion: int, cached_weight: float) -> int:
    """Tokens charged to a TPM window: uncached prompt and output in full, cached prompt at `cached_weight`."""
    cached = min(max(cached, 0), prompt)
    return prompt - cached + round(cached * cached_weight) + completion


def max_output_tokens(body: dict[str, Any], fields: tuple[str, ...] = OUTPUT_CAP_FIELDS) -> int:
    """The most output tokens a request may produce (0 if it sets no cap)."""
    cap = 0
    for f in fields:  # a loop, not next(genexpr): this runs up to three times per request
        value = body.get(f)
        if value:
            cap = value
            break
    n = body.get("n") or 1
    if not isinstance(cap, int) or not isinstance(n, int):
        return 0
    return (cap if cap > 0 else 0) * (n if n > 1 else 1)  # max() twice, without the two builtin calls


def limit_spec(limits: LimitsConfig, lease_s: float) -> LimitSpec:
    """Config limits → what the store enforces (budget in integer micro-dollars)."""
    budget = limits.monthly_budget_usd
    return LimitSpec(
        rpm=limits.rpm,
        tpm=limits.tpm,
        concurrent=limits.concurrent,
        budget_micros=None if budget is None else round(budget * MICROS_PER_USD),
        lease_s=lease_s,
    )


def seconds_to_next_month(now: datetime) -> float:
    """Seconds until the budget period (calendar month, UTC) rolls over."""
    nxt = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    return (nxt - now).total_seconds()


def cap_max_tokens(body: dict[str, Any], cap: int, fields: tuple[str, ...] = OUTPUT_CAP_FIELDS) -> None:
    """Lower the request's output cap to `cap` (setting the last of `fields` if it had none)."""
    present = False
    for key in fields:
        value = body.get(key)
        if isinstance(value, int):
            body[key] = min(value, cap)
            present = True
    if not present and fields:  # a surface with no output cap (tokenize, pooling) has nothing to lower
        body[fields[-1]] = cap


_MESSAGES: dict[LimitReason, tuple[str, str, str]] = {
    "rpm": ("requests", "rate_limit_exceeded", "Rate limit reached for requests per minute"),
    "tpm": ("tokens", "rate_limit_exceeded", "Rate limit reached for tokens per minute"),
    "concurrent": ("requests", "rate_limit_exceeded", "Too many concurrent requests"),
    "budget": ("insufficient_quota", "budget_exceeded", "Monthly budget exhausted"),
}


def limit_error(reason: LimitReason, tenant_id: str, retry_after_s: float) -> GatewayError:
    """429 in OpenAI's rate-limit shape, Retry-After in whole seconds (at least 1), x-kvgate-limit saying why."""
    type_, code, text = _MESSAGES[reason]
    retry = max(1, math.ceil(retry_after_s))
    return GatewayError(
        429,
        f"{text} for tenant {tenant_id}. Please try again in {retry}s.",
        type=type_,
        code=code,
        headers={RETRY_AFTER: str(retry), LIMIT: f"rejected:{reason}"},
        reason=reason,
    )


class Limiter:
    """Admits requests against a tenant's limits and settles them afterwards."""

    def __init__(self, store: Store, fail_mode: str, *, ledger: SpendLedger | None = None) -> None:
        if fail_mode not in ("open", "closed"):
            raise ValueError(f"fail_mode must be open or closed, not {fail_mode!r}")
        self._store = store
        self._fail_mode: Literal["open", "closed"] = "open" if fail_mode == "open" else "closed"
        self.ledger = ledger or SpendLedger(store)

    async def admit(self, ctx: RequestContext) -> Admission:
        """Estimate tokens, check every limit in one store call; raise 429/503 or degrade."""
        # The tenant's limits came with its record from tenancy (built once per tenant, app/tenancy.py).
        tenant = ctx.tenant
        assert tenant is not None  # the tenancy stage ran (it answers 401/503 rather than leave it unset)
        tenant_id, limits, spec = tenant.id, tenant.limits, tenant.limit_spec
        ctx.estimated_input_tokens = estimate_input_tokens(ctx.prompt)
        admission = Admission(tenant, uuid4_hex())
        if spec.unlimited:
            return admission
        cap_fields = ctx.surface.output_cap_fields
        tokens = ctx.estimated_input_tokens + max_output_tokens(ctx.body, cap_fields)
        if spec.tpm is not None:
            tokens = min(tokens, spec.tpm)
        degrade = limits.on_exceed == "degrade"
        now = datetime.now(UTC)
        try:
            result = await self._store.admit(
                tenant_id, spec, tokens, admission.lease_id, f"{now.year:04d}-{now.month:02d}", degrade
            )
        except StoreUnavailable:
            if self._fail_mode == "closed":
                raise store_unavailable(
                    "Shared state is unavailable; request rejected (fail_mode closed)."
                ) from None
            admission.enforced = False
            ctx.limit_notes.append("unenforced:store_unavailable")
            return admission
        admission.lease_taken = result.lease_taken
        admission.tokens_reserved = result.tokens_reserved
        if result.lease_taken and ctx.stream:  # a stream lives as long as it keeps sending: so does its lease
            admission.renewal = asyncio.create_task(self._renew(admission), name="kvgate-lease-renewal")
        if result.admitted or result.reason is None:
            return admission
        if not degrade:
            retry = seconds_to_next_month(now) if result.reason == "budget" else result.retry_after_s
            raise limit_error(result.reason, tenant_id, retry)
        admission.degraded = result.reason
        cap_max_tokens(ctx.body, limits.degrade_max_tokens, cap_fields)
        # The class follows from admission.degraded in classify; the note tells the client why.
        ctx.limit_notes.append(f"degraded:{result.reason}:class=bulk:max_tokens={limits.degrade_max_tokens}")
        return admission

    def reserve_estimate(self, admission: Admission, estimate: CallEstimate) -> None:
        """Move the TPM reservation to the post-pick estimate (exact prompt, predicted cached tokens at their
        weight); the store write runs beside the upstream call, so the request waits for nothing."""
        spec = admission.spec
        if not admission.enforced or not admission.tokens_reserved or spec.tpm is None:
            return
        weight = admission.tenant.limits.tpm_cached_weight
        predicted = tpm_tokens(estimate.prompt_tokens, estimate.cached_tokens, estimate.output_tokens, weight)
        target = min(max(predicted, 1), spec.tpm)
        delta = target - admission.tokens_reserved
        if delta == 0:
            return
        admission.tokens_reserved = target
        admission.correction = asyncio.create_task(self._move_reservation(admission, delta, admission.correction))

    async def _move_reservation(self, admission: Admission, delta: int, before: asyncio.Task[None] | None) -> None:
        if before is not None:
            await before  # a failover's second estimate lands after the first
        release = Release(admission.tenant_id, None, admission.spec.tpm, delta, admission.spec.window_s)
        try:
            await self._store.settle(release, None)
        except Exception as err:  # the window did not move: settle corrects from the reservation it holds
            admission.tokens_reserved -= delta
            if not isinstance(err, StoreUnavailable):
                log.exception("moving the TPM reservation of %s failed", admission.tenant_id)

    async def _renew(self, admission: Admission) -> None:
        """Push the lease's expiry out every third of its life until settle cancels this (or it is lost)."""
        lease_s = admission.spec.lease_s
        every = lease_s / 3
        while True:
            await asyncio.sleep(every)
            try:
                held = await self._store.renew_lease(admission.tenant_id, admission.lease_id, lease_s)
            except StoreUnavailable:
                continue  # the next round may reach it; meanwhile the lease stands until it expires
            except Exception:
                log.exception("renewing the lease of %s failed", admission.tenant_id)
                return
            if not held:
                return

    async def settle(self, ctx: RequestContext, admission: Admission) -> None:
        """Release the slot, reconcile TPM with actual usage, record spend. Never raises."""
        if admission.renewal is not None:
            admission.renewal.cancel()
        try:
            if admission.correction is not None:
                await admission.correction  # never raises: tokens_reserved is what the window holds
            spend = spend_record(ctx, admission.tenant_id, admission.lease_id)
            release = None
            if admission.enforced and (admission.lease_taken or admission.tokens_reserved):
                weight = admission.tenant.limits.tpm_cached_weight
                u = ctx.usage
                release = Release(
                    tenant_id=admission.tenant_id,
                    lease_id=admission.lease_id if admission.lease_taken else None,
                    tpm=admission.spec.tpm if admission.tokens_reserved else None,
                    token_delta=tpm_tokens(u.prompt_tokens, u.cached_tokens, u.completion_tokens, weight)
                    - admission.tokens_reserved
                    if admission.tokens_reserved
                    else 0,
                    window_s=admission.spec.window_s,
                )
            try:
                await self._store.settle(release, spend)
            except StoreUnavailable:
                # The lease expires by itself; the spend must not be lost.
                self.ledger.buffer(spend)
                return
            if self.ledger.pending:
                await self.ledger.flush()
        except Exception:
            log.exception("settling request %s failed", ctx.request_id)
