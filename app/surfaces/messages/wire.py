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

# vLLM's AnthropicMessage roles: a `system` turn anywhere in `messages` (Claude Code sends one for any model
# name outside its own list: beta mid-conversation-system-2026-04-07) is rendered where it stands, or merged
# into the leading system prompt by a template that wants system first.
ROLES = ("user", "assistant", "system")


def unexpected_role(index: int, role: object) -> str:
    """Anthropic's wording for a role it does not take: Claude Code falls back to its older prompt shape on a
    400 that says `Unexpected role` and `input message role`."""
    shown = role if isinstance(role, str) else type(role).__name__
    return (f'messages.{index}.role: Unexpected role "{shown}". Allowed input message roles are "user", '
            '"assistant" and "system".')
