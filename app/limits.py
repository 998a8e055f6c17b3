"""Limits: requests/min, tokens/min, concurrent requests and a monthly USD budget, per tenant.

One store round trip admits a request (all four checks, committed atomically only if all pass) and
one settles it (lease released, TPM corrected to actual tokens, spend recorded).

Token estimate (before the call): ceil(characters of message/prompt text / 4) + 4 per chat message
for role and framing; tools/functions count by their JSON length. The TPM window is charged that
estimate plus the output the request may produce (max_completion_tokens or max_tokens, times n),
capped at the tenant's tpm so one large request can still pass an idle window; settle replaces the
reservation with the actual prompt + completion tokens.

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

import logging
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from app.config import LimitsConfig
from app.context import ClassDecision, RequestContext
from app.errors import GatewayError
from app.spend import SpendLedger, spend_record
from app.store.base import MICROS_PER_USD, LimitReason, LimitSpec, Release, Store, StoreUnavailable
from app.tenancy import ANONYMOUS, TenantRegistry, store_unavailable

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


@dataclass(slots=True)
class Admission:
    """What admit granted; settle needs it back to release and reconcile."""

    tenant_id: str
    lease_id: str  # also the spend record's id
    spec: LimitSpec
    lease_taken: bool = False
    tokens_reserved: int = 0
    enforced: bool = True  # False: the store was unreachable and fail_mode is open
    degraded: LimitReason | None = None


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += len(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
            elif isinstance(part, int):  # a pre-tokenized prompt: one token each
                total += CHARS_PER_TOKEN
            elif isinstance(part, list):
                total += _text_chars(part)
        return total
    return 0


def estimate_input_tokens(body: dict[str, Any]) -> int:
    """Prompt tokens a request will likely use, before any tokenizer runs (see module doc)."""
    chars = 0
    framing = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if not isinstance(m, dict):
                continue
            framing += TOKENS_PER_MESSAGE
            chars += _text_chars(m.get("content"))
            if m.get("tool_calls"):
                chars += len(orjson.dumps(m["tool_calls"]))
    for key in ("prompt", "input"):
        chars += _text_chars(body.get(key))
    for key in ("tools", "functions"):
        if body.get(key):
            chars += len(orjson.dumps(body[key]))
    return math.ceil(chars / CHARS_PER_TOKEN) + framing


def max_output_tokens(body: dict[str, Any]) -> int:
    """The most output tokens a request may produce (0 if it sets no cap)."""
    cap = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    n = body.get("n") or 1
    if not isinstance(cap, int) or not isinstance(n, int):
        return 0
    return max(cap, 0) * max(n, 1)


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


def cap_max_tokens(body: dict[str, Any], cap: int) -> None:
    """Lower the request's output cap to `cap` (setting max_tokens if it had none)."""
    present = False
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int):
            body[key] = min(value, cap)
            present = True
    if not present:
        body["max_tokens"] = cap


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
        headers={"Retry-After": str(retry), "x-kvgate-limit": f"rejected:{reason}"},
    )


class Limiter:
    """Admits requests against a tenant's limits and settles them afterwards."""

    def __init__(
        self,
        store: Store,
        registry: TenantRegistry,
        fail_mode: str,
        *,
        ledger: SpendLedger | None = None,
        lease_s: float = 360.0,
    ) -> None:
        if fail_mode not in ("open", "closed"):
            raise ValueError(f"fail_mode must be open or closed, not {fail_mode!r}")
        self._store = store
        self._registry = registry
        self._fail_mode: Literal["open", "closed"] = "open" if fail_mode == "open" else "closed"
        self.ledger = ledger or SpendLedger(store)
        self._lease_s = lease_s

    async def admit(self, ctx: RequestContext) -> Admission:
        """Estimate tokens, check every limit in one store call; raise 429/503 or degrade."""
        tenant_id = ctx.tenant.id if ctx.tenant is not None else ANONYMOUS
        limits = self._registry.limits_for(tenant_id)
        spec = limit_spec(limits, self._lease_s)
        ctx.estimated_input_tokens = estimate_input_tokens(ctx.body)
        admission = Admission(tenant_id, uuid.uuid4().hex, spec)
        if spec.unlimited:
            return admission
        tokens = ctx.estimated_input_tokens + max_output_tokens(ctx.body)
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
        if result.admitted or result.reason is None:
            return admission
        if not degrade:
            retry = seconds_to_next_month(now) if result.reason == "budget" else result.retry_after_s
            raise limit_error(result.reason, tenant_id, retry)
        admission.degraded = result.reason
        ctx.route_class = ClassDecision("bulk", "degraded")
        cap_max_tokens(ctx.body, limits.degrade_max_tokens)
        ctx.limit_notes.append(f"degraded:{result.reason}:class=bulk:max_tokens={limits.degrade_max_tokens}")
        return admission

    async def settle(self, ctx: RequestContext, admission: Admission) -> None:
        """Release the slot, reconcile TPM with actual usage, record spend. Never raises."""
        try:
            spend = spend_record(ctx, admission.tenant_id, admission.lease_id)
            release = None
            if admission.enforced and (admission.lease_taken or admission.tokens_reserved):
                release = Release(
                    tenant_id=admission.tenant_id,
                    lease_id=admission.lease_id if admission.lease_taken else None,
                    tpm=admission.spec.tpm if admission.tokens_reserved else None,
                    token_delta=ctx.usage.total_tokens - admission.tokens_reserved
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
