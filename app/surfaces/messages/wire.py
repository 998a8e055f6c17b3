"""Anthropic's wire words that the Messages adapter and its migration both speak: error types and the envelope,
and the billing line Claude Code puts at the head of its system prompt."""

from __future__ import annotations

import orjson

_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
    529: "overloaded_error",
}  # fmt: skip


def anthropic_error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status (5xx other than overload: api_error)."""
    return _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error(status: int, message: str) -> bytes:
    """Anthropic's error envelope."""
    return orjson.dumps({"type": "error", "error": {"type": anthropic_error_type(status), "message": message}})


BILLING_HEADER = "x-anthropic-billing-header"
