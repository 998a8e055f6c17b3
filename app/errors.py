"""Errors the gateway itself makes. Each carries its HTTP status, its reason and, for upstream failures,
what kind of failure it was; the API surface the request came in on renders the envelope."""

from __future__ import annotations

from typing import Literal

import orjson

from app.headers import UPSTREAM_STATUS

# How an upstream attempt failed: the dispatcher's verdict on the replica, and whether to try another.
FailureKind = Literal["connect", "timeout", "status_5xx", "protocol"]


class GatewayError(Exception):
    """An error with an HTTP status and the fields of OpenAI's envelope `{"error": {message, type, param, code}}`.

    `reason` is the stable word telemetry records (a limit name, a code); `failure` is set on upstream errors.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        reason: str | None = None,
        failure: FailureKind | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.reason = reason or code or type
        self.failure = failure

    def body(self) -> bytes:
        """OpenAI's JSON error envelope."""
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> bytes:
    """Serialize OpenAI's error envelope."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    """400 invalid_request_error."""
    return GatewayError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    """404: an unknown model (OpenAI calls it an invalid request, with code model_not_found)."""
    return GatewayError(404, message, param=param, code=code)


def too_large(limit: int) -> GatewayError:
    """413: the body is over upstream.max_body_bytes."""
    return GatewayError(413, f"Request body exceeds {limit} bytes.", code="request_too_large")


def invalid_key(message: str) -> GatewayError:
    """401: no key, or a key that names no tenant."""
    return GatewayError(401, message, type="invalid_request_error", code="invalid_api_key")


def store_unavailable(message: str) -> GatewayError:
    """503: shared state is needed and unreachable."""
    return GatewayError(503, message, type="service_unavailable", code="store_unavailable")


def upstream_unavailable(message: str) -> GatewayError:
    """503: no healthy replica can take the request."""
    return GatewayError(503, message, type="service_unavailable", code="no_healthy_upstream")


def upstream_unreachable(message: str, failure: FailureKind = "connect") -> GatewayError:
    """502: the upstream could not be reached or broke the protocol."""
    return GatewayError(502, message, type="upstream_error", code="upstream_unreachable", failure=failure)


class UpstreamStatusError(GatewayError):
    """502 for a 5xx head, with the upstream's status and body: the dispatcher compares them across replicas to
    tell a replica that fails from a body that fails everywhere (app/attribution.py), and answers with them."""

    def __init__(self, replica: str, status: int, body: bytes) -> None:
        super().__init__(
            502, f"upstream {replica} answered {status}", type="upstream_error", code="upstream_error",
            headers={UPSTREAM_STATUS: str(status)}, failure="status_5xx",
        )  # fmt: skip
        self.upstream_status = status
        self.upstream_body = body


def upstream_status(replica: str, status: int, body: bytes = b"") -> UpstreamStatusError:
    """502: the upstream answered with a 5xx (its body kept, up to what the transport read)."""
    return UpstreamStatusError(replica, status, body)


def upstream_timeout(message: str) -> GatewayError:
    """504: the upstream did not answer in time."""
    return GatewayError(504, message, type="timeout", code="upstream_timeout", failure="timeout")
