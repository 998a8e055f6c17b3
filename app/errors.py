"""OpenAI-shaped errors: every error the gateway itself produces goes through GatewayError."""

from __future__ import annotations

import orjson


class GatewayError(Exception):
    """An error with an HTTP status and OpenAI's envelope `{"error": {message, type, param, code}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        """The JSON error envelope."""
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> bytes:
    """Serialize OpenAI's error envelope."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    """400 invalid_request_error."""
    return GatewayError(400, message, param=param, code=code)


def upstream_unavailable(message: str) -> GatewayError:
    """503: no healthy replica can take the request."""
    return GatewayError(503, message, type="service_unavailable", code="no_healthy_upstream")


def upstream_unreachable(message: str) -> GatewayError:
    """502: the upstream could not be reached or broke the protocol."""
    return GatewayError(502, message, type="upstream_error", code="upstream_unreachable")


def upstream_timeout(message: str) -> GatewayError:
    """504: the upstream did not answer in time."""
    return GatewayError(504, message, type="timeout", code="upstream_timeout")
