"""What an API surface reads and writes of one request: the few fields of the request context it touches.

Surfaces type against this protocol, not against app/context.py's RequestContext (which implements it), so the
context may name its surface's type without a circle, and a surface is testable with any object that has these.
"""

from __future__ import annotations

from typing import Any, Protocol

from app.records import Timing, Usage


class BodyMaker(Protocol):
    """The one thing a migration asks of the request's own surface: the body vLLM gets."""

    def upstream_body(
        self, body: dict[str, Any], *, served_model: str, priority: int | None, cache_salt: str | None
    ) -> dict[str, Any]:
        """The body vLLM gets: the served model name and the gateway's scheduling fields."""
        ...


class Exchange(Protocol):
    """One request as its surface sees it: the client's body and asks, and where its reply is accounted."""

    response_id: str | None  # written: the reply's id (Responses: where continuations must go)
    error_type: str | None  # written: an upstream error event's type, for the span

    @property
    def body(self) -> dict[str, Any]:
        """The body as it goes upstream (after normalization)."""
        ...

    @property
    def path(self) -> str:
        """The endpoint the client called."""
        ...

    @property
    def model(self) -> str:
        """The public model name the client sent."""
        ...

    @property
    def cache_salt(self) -> str | None:
        """The tenant's cache salt, which a continuation must carry too."""
        ...

    @property
    def client_wants_usage(self) -> bool:
        """Whether the client asked for usage in its stream (else the gateway's own usage chunk is dropped)."""
        ...

    @property
    def surface(self) -> BodyMaker:
        """The request's surface (a migration rebuilds its body through it)."""
        ...

    @property
    def usage(self) -> Usage:
        """Where reported token counts go."""
        ...

    @property
    def timing(self) -> Timing:
        """Where the first token's instant goes."""
        ...

    @property
    def finish_reasons(self) -> list[str]:
        """Where each choice's finish reason goes."""
        ...
