"""Span names and attribute sets: GenAI semantic conventions (v1.41 names) plus the gateway's kvgate.* keys.

Pure functions of the request context, so what a span carries is testable without a tracer. Nothing here
reads message text except `input_messages`, which the caller invokes only for tenants that opted in.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import orjson

from app.context import RequestContext

PROVIDER_NAME = "vllm"

# GenAI / general semantic-convention keys.
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
REQUEST_STREAM = "gen_ai.request.stream"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
TOKEN_TYPE = "gen_ai.token.type"
INPUT_MESSAGES = "gen_ai.input.messages"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
URL_PATH = "url.path"

# Gateway keys.
KV_TENANT = "kvgate.tenant"
KV_POOL = "kvgate.pool"
KV_REPLICA = "kvgate.replica"
KV_CLASS = "kvgate.class"
KV_CLASS_REASON = "kvgate.class.reason"
KV_ROUTE_REASON = "kvgate.route.reason"
KV_ROUTE_POLICY = "kvgate.route.policy"
KV_ROUTE_SPILLED = "kvgate.route.spilled"
KV_ROUTE_ATTEMPT = "kvgate.route.attempt"
KV_ROUTE_DETAIL = "kvgate.route.detail"
KV_ROUTE_RUNNER_UP = "kvgate.route.runner_up"
KV_ROUTE_PRIORITY = "kvgate.route.priority"
KV_COST = "kvgate.cost_usd"
KV_SAVINGS = "kvgate.savings_usd"
KV_OVERHEAD_MS = "kvgate.overhead_ms"
KV_QUEUE_WAIT_MS = "kvgate.queue.wait_ms"
KV_REQUEST_ID = "kvgate.request_id"
KV_API = "kvgate.api"
KV_MIGRATIONS = "kvgate.stream.migrations"
KV_MIGRATION_OUTCOMES = "kvgate.stream.migration_outcomes"
KV_USAGE_ESTIMATED = "kvgate.usage.estimated"
KV_REJECTED = "kvgate.rejected_reason"
KV_NORMALIZE_MODE = "kvgate.normalize.mode"
KV_NORMALIZE_MOVED = "kvgate.normalize.moved"
KV_NORMALIZE_RULES = "kvgate.normalize.rules"
KV_NORMALIZE_TOOLS = "kvgate.normalize.tools_canonicalized"
KV_NORMALIZE_DATE_PINNED = "kvgate.normalize.date_pinned"
KV_NORMALIZE_APPLIED = "kvgate.normalize.applied"

_DEFAULT_PORTS = {"http": 80, "https": 443}


def server_span_name(ctx: RequestContext) -> str:
    """HTTP server span name: `{method} {route}`."""
    return f"POST {ctx.path}"


def client_span_name(operation: str, model: str) -> str:
    """GenAI client span name: `{gen_ai.operation.name} {gen_ai.request.model}`."""
    return f"{operation} {model}"


def replica_address(url: str) -> tuple[str, int]:
    """server.address and server.port of a replica base URL."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)


def error_type(ctx: RequestContext) -> str | None:
    """The error.type value: the pipeline's error class, else the HTTP status on 4xx/5xx, else None."""
    if ctx.error_type:
        return ctx.error_type
    if ctx.status >= 400:
        return str(ctx.status)
    return None


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def client_start_attributes(ctx: RequestContext, served_model: str, address: tuple[str, int]) -> dict[str, Any]:
    """Attributes known when the upstream call starts (sampling decisions may read them)."""
    body = ctx.body
    attrs: dict[str, Any] = {
        OPERATION_NAME: ctx.operation,
        PROVIDER: PROVIDER_NAME,
        REQUEST_MODEL: served_model,
        SERVER_ADDRESS: address[0],
        SERVER_PORT: address[1],
        REQUEST_STREAM: ctx.stream,
    }
    max_tokens = _number(body.get("max_completion_tokens", body.get("max_tokens")))
    if max_tokens is not None:
        attrs[REQUEST_MAX_TOKENS] = int(max_tokens)
    temperature = _number(body.get("temperature"))
    if temperature is not None:
        attrs[REQUEST_TEMPERATURE] = float(temperature)
    top_p = _number(body.get("top_p"))
    if top_p is not None:
        attrs[REQUEST_TOP_P] = float(top_p)
    return attrs


def gateway_attributes(ctx: RequestContext) -> dict[str, Any]:
    """kvgate.* attributes: who paid, where it ran, why, what it cost, what normalization did."""
    attrs: dict[str, Any] = {KV_COST: ctx.cost_usd, KV_SAVINGS: ctx.savings_usd, KV_API: ctx.surface.name}
    if ctx.migration_outcomes:
        attrs[KV_MIGRATIONS] = ctx.migrations
        attrs[KV_MIGRATION_OUTCOMES] = list(ctx.migration_outcomes)
    if ctx.usage_estimated:
        attrs[KV_USAGE_ESTIMATED] = True
    if ctx.tenant is not None:
        attrs[KV_TENANT] = ctx.tenant.id
    route = ctx.route
    if route is not None:
        attrs[KV_POOL] = route.pool
        attrs[KV_REPLICA] = route.replica
        attrs[KV_ROUTE_REASON] = route.reason
        attrs[KV_ROUTE_POLICY] = route.policy
        # Span attributes cost a few µs each in the SDK: the usual values are left out.
        if route.spilled:
            attrs[KV_ROUTE_SPILLED] = True
        if route.detail:
            attrs[KV_ROUTE_DETAIL] = route.detail
        if route.runner_up is not None:
            attrs[KV_ROUTE_RUNNER_UP] = route.runner_up
        if route.priority is not None:
            attrs[KV_ROUTE_PRIORITY] = route.priority
        if route.attempt > 1:
            attrs[KV_ROUTE_ATTEMPT] = route.attempt
    ticket = ctx.queue_ticket
    if ticket is not None:
        attrs[KV_QUEUE_WAIT_MS] = ticket.waited_s * 1000.0
    if ctx.route_class is not None:
        attrs[KV_CLASS] = ctx.route_class.route_class
        attrs[KV_CLASS_REASON] = ctx.route_class.reason
    report = ctx.normalize_report
    if report is not None:
        attrs[KV_NORMALIZE_MODE] = report.mode
        attrs[KV_NORMALIZE_MOVED] = report.moved_total
        attrs[KV_NORMALIZE_APPLIED] = report.applied
        if report.tools_canonicalized:
            attrs[KV_NORMALIZE_TOOLS] = report.tools_canonicalized
        if report.date_pinned:
            attrs[KV_NORMALIZE_DATE_PINNED] = True
        if report.moved:
            attrs[KV_NORMALIZE_RULES] = [f"{rule}:{n}" for rule, n in sorted(report.moved.items())]
    return attrs


def client_end_attributes(ctx: RequestContext, served_model: str) -> dict[str, Any]:
    """Response, usage and error attributes of the upstream call, plus kvgate.*."""
    attrs = gateway_attributes(ctx)
    usage = ctx.usage
    attrs[USAGE_INPUT_TOKENS] = usage.prompt_tokens
    attrs[USAGE_OUTPUT_TOKENS] = usage.completion_tokens
    attrs[USAGE_CACHE_READ] = usage.cached_tokens
    # vLLM answers under the name it serves; the gateway does not see a different one.
    attrs[RESPONSE_MODEL] = served_model
    if ctx.response_id:
        attrs[RESPONSE_ID] = ctx.response_id
    if ctx.finish_reasons:
        attrs[RESPONSE_FINISH_REASONS] = list(ctx.finish_reasons)
    err = error_type(ctx)
    if err is not None:
        attrs[ERROR_TYPE] = err
    return attrs


def server_end_attributes(ctx: RequestContext) -> dict[str, Any]:
    """What finds a request among SERVER spans: status, tenant, pool, cost (the CLIENT span has the rest)."""
    attrs: dict[str, Any] = {HTTP_STATUS: ctx.status, KV_COST: ctx.cost_usd}
    if ctx.tenant is not None:
        attrs[KV_TENANT] = ctx.tenant.id
    if ctx.route is not None:
        attrs[KV_POOL] = ctx.route.pool
    return attrs


def server_start_attributes(ctx: RequestContext) -> dict[str, Any]:
    """Attributes of the inbound request known at arrival."""
    return {HTTP_METHOD: "POST", HTTP_ROUTE: ctx.path, URL_PATH: ctx.path, KV_REQUEST_ID: ctx.request_id}


def input_messages(ctx: RequestContext) -> str:
    """gen_ai.input.messages as JSON (role + parts, as the request's surface reads them) — opt-in only."""
    return orjson.dumps(ctx.surface.input_messages(ctx.body)).decode()
