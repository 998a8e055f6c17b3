"""What a surface's mid-stream migration provides: the hand-offs between the relay, the dispatcher and it.

A migration reads back what the client was sent (`delivered`), says when a continuation could not be faithful
(`not_migratable`, a metric label), builds the request that continues the unfinished turn elsewhere
(`continuation`: path and body, the surface's own endpoint or one that takes a partial assistant turn), and
splices the new stream into the client's in the client's event shapes (`splice`). The relay and the
dispatcher only call these; chat, Responses and Messages each have a module of their own in this package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.surfaces.exchange import Exchange
from app.surfaces.sse import event_doc, event_parts


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

    def resume_text(self) -> str:
        """The text the continuation is given: the delivered text without its trailing whitespace.

        The replica re-tokenizes the partial turn from text, and a whitespace run the model wrote as separate
        tokens ("\\n", "\\n") re-tokenizes as one ("\\n\\n"), a context the model never saw, so it may go
        on differently; ending on the last word keeps the tokens it wrote, and the continuation writes the
        whitespace again (the splice drops what the client already has, see HeldBack).
        """
        kept = self.text.rstrip()
        return kept if kept else self.text

    def held_back(self) -> str:
        """The delivered text's tail that the continuation is not given (and will write again)."""
        return self.text[len(self.resume_text()):]

    def blocker(self) -> str | None:
        """What in the delivered stream rules a faithful continuation out (a metric label), or None."""
        if self.tool_call:
            return "tool_call"
        return self.unfaithful or ("finished" if self.finished else None)


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


@dataclass(frozen=True, slots=True)
class Migration:
    """One surface's way of continuing a cut stream: four pure pieces, called by the relay and the dispatcher."""

    # The relayed events read back (only after a failure: the relay itself does not parse).
    delivered: Callable[[Sequence[bytes]], Delivered]
    # Why the stream cannot continue faithfully elsewhere (a metric label), or None; gets the client's body.
    not_migratable: Callable[[Mapping[str, Any], Delivered], str | None]
    # The request that continues the delivered text: (ctx, delivered, sent tokens, served model, priority).
    continuation: Callable[[Exchange, Delivered, int, str, int | None], Resend]
    # A fresh splice of the continuation stream into the client's: (delivered, sent tokens).
    splice: Callable[[Delivered, int], Splicer]


class HeldBack:
    """Drops the held-back tail (whitespace the client already has) from the start of the continuation's text,
    as far as the continuation writes it again."""

    __slots__ = ("held",)

    def __init__(self, held: str) -> None:
        self.held = held

    def text(self, text: str) -> str:
        """The part of one continuation text delta the client does not have yet."""
        if not self.held or not text:
            return text
        n = 0
        while n < len(text) and n < len(self.held) and text[n] == self.held[n]:
            n += 1
        self.held = self.held[n:] if n == len(text) else ""
        return text[n:]


def after_held(held: str, text: str) -> str:
    """A continuation's whole text without the held-back tail it wrote again (HeldBack over all of it)."""
    return HeldBack(held).text(text)


def same_endpoint(ctx: Exchange, body: dict[str, Any], served: str, priority: int | None) -> Resend:
    """A continuation body sent where the request went, through its surface's upstream_body."""
    out = ctx.surface.upstream_body(body, served_model=served, priority=priority, cache_salt=ctx.cache_salt)
    return Resend(ctx.path, out)


def named_docs(events: Iterable[bytes]) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """(event name, JSON object) of each named SSE event that carries one."""
    for event in events:
        name, data = event_parts(event)
        doc = event_doc(data) if data else None
        if doc is not None:
            yield name, doc


def lowered_caps(body: Mapping[str, Any], fields: Sequence[str], sent_tokens: int) -> dict[str, int]:
    """The body's output caps lowered by the tokens already sent (at least 1 each), to merge into a continuation."""
    return {f: max(v - sent_tokens, 1) for f in fields if (v := int_at(body, f)) is not None}


def member(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    """doc[key] when it is a JSON object, else an empty one (events are read defensively)."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def int_at(doc: Mapping[str, Any], key: str) -> int | None:
    """doc[key] when it is an integer (not a bool), else None."""
    value = doc.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
