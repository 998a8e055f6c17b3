"""What a surface's mid-stream migration provides: the hand-offs between the relay, the dispatcher and it.

A migration reads back what the client was sent (`delivered`), says when a continuation could not be faithful
(`not_migratable`, a metric label), builds the request that continues the unfinished turn elsewhere
(`continuation`: path and body, the surface's own endpoint or one that takes a partial assistant turn), and
splices the new stream into the client's in the client's event shapes (`splice`). The relay and the
dispatcher only call these; chat, Responses and Messages each have a module of their own in this package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.context import RequestContext


@dataclass(slots=True)
class Delivered:
    """What the client got of a stream so far, read back from the relayed events (only after a failure)."""

    text: str = ""  # the assistant text, the partial turn a continuation extends
    chunks: int = 0  # events that carried generated content (a cut stream is billed for these)
    tool_call: bool = False
    finished: bool = False
    id: str | None = None
    created: int | None = None
    unfaithful: str | None = None  # why a continuation could not splice in faithfully (a metric label)


class Splicer(Protocol):
    """Rewrites one event of the continuation stream into the events the client gets (none, one or more)."""

    def rewrite(self, event: bytes) -> list[bytes]:
        """The client's events for one upstream event."""
        ...


@dataclass(frozen=True, slots=True)
class Resend:
    """Where and what to send to continue the turn (the body ready for the wire but for serialization)."""

    path: str
    body: dict[str, Any]


class Migration(Protocol):
    """One surface's way of continuing a cut stream."""

    def delivered(self, events: Sequence[bytes]) -> Delivered:
        """Parse the relayed events."""
        ...

    def not_migratable(self, body: Mapping[str, Any], got: Delivered) -> str | None:
        """Why this stream cannot continue faithfully elsewhere (a metric label), or None."""
        ...

    def continuation(
        self, ctx: RequestContext, got: Delivered, sent_tokens: int, *, served: str, priority: int | None
    ) -> Resend:
        """The request that continues the delivered text as the assistant's unfinished turn."""
        ...

    def splice(self, got: Delivered, sent_tokens: int) -> Splicer:
        """A fresh splice of the continuation stream into the client's."""
        ...



def member(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    """doc[key] when it is a JSON object, else an empty one (events are read defensively)."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def int_at(doc: Mapping[str, Any], key: str) -> int | None:
    """doc[key] when it is an integer (not a bool), else None."""
    value = doc.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
