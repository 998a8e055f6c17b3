"""The adapter protocol: what one API surface (chat completions, Messages, …) tells the shared stages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from app.errors import GatewayError, bad_request
from app.prompt import PromptView
from app.records import Usage

if TYPE_CHECKING:
    from collections.abc import Callable

    from app.records import Operation
    from app.surfaces.exchange import Exchange
    from app.surfaces.migration import Migration
    from app.surfaces.placement import TailPlacement


@dataclass(frozen=True, slots=True)
class WarmRequest:
    """A request that caches a body's stable prefix (or its whole conversation) and generates one token: the path
    and body (no model, no salt: app/prewarm adds them through the surface's upstream_body), and its size in
    characters (text plus the tools' JSON: what app/prewarm budgets, and how it tells which fills more blocks)."""

    path: str
    body: dict[str, Any]
    chars: int = 0


@dataclass(frozen=True, slots=True)
class Parsed:
    """What validation learned of a body besides its prompt: streaming, and whether the client wants usage."""

    stream: bool
    client_wants_usage: bool = False


class StreamObserver(Protocol):
    """Reads one upstream SSE stream event by event: accounts usage into the context, decides what to relay."""

    done: bool  # the upstream sent its protocol's final event
    delivered: int  # events relayed that carried generated content (a cut stream is billed for these)

    def observe(self, event: bytes) -> bytes | None:
        """The bytes to relay for one complete SSE event (None: drop it)."""
        ...

    def ending(self, trailer: bytes) -> bytes:
        """What the client gets after the last relayed event: the cost trailer and the protocol's end marker."""
        ...


class Surface(Protocol):
    """One API surface: parse/validate, prompt view, usage, error envelope, model name mapping."""

    name: str  # a label on spans and metrics: chat_completions, completions, embeddings, …
    operation: Operation  # the GenAI operation name
    can_stream: bool
    normalizable: bool
    has_tools: bool  # the body's `tools` may be canonicalized
    template_kwargs: bool  # the body takes `chat_template_kwargs` (vLLM's chat endpoints)
    output_cap_fields: tuple[str, ...]  # where the body caps its output, newest first
    forward: tuple[str, ...]  # request headers passed on to vLLM as they came (anthropic-version)
    # What the path and the optional features ask of an API, so none of them names one:
    migration: Migration | None  # how a cut stream continues on another replica (None: it ends in an error event)
    stores_responses: bool  # the replica keeps each response (GET, cancel and continuations must find it there)
    hashes_blocks: bool  # its prompt renders through the model's chat template into exact KV blocks (kv_events)

    def continues(self, body: Mapping[str, Any]) -> str | None:
        """The id of the stored response this request continues (it must go where that response lives), or None."""
        ...

    def validate(self, body: dict[str, Any]) -> Parsed:
        """Check the body's fields (raise 400 GatewayError); may add what the gateway needs (include_usage)."""
        ...

    def view(self, body: Mapping[str, Any]) -> PromptView:
        """The typed view of the body's prompt."""
        ...

    def place_tail(self, body: dict[str, Any], lines: list[str], placement: TailPlacement) -> dict[str, Any]:
        """A copy of `body` with moved volatile lines restated at the tail, in this API's idiom."""
        ...

    def upstream_body(
        self, body: dict[str, Any], *, served_model: str, priority: int | None, cache_salt: str | None
    ) -> dict[str, Any]:
        """The body vLLM gets: the served model name and the gateway's scheduling fields."""
        ...

    def read_reply(self, doc: Mapping[str, Any], ctx: Exchange) -> None:
        """Record usage, response id and finish reasons from a complete 200 body."""
        ...

    def public_body(self, body: bytes, served: str, public: str) -> bytes:
        """A complete body with the served model name put back to the public one."""
        ...

    def upstream_error(self, status: int, body: bytes) -> bytes:
        """An upstream 4xx body as this API's client expects it."""
        ...

    def stream_observer(self, ctx: Exchange, served: str) -> StreamObserver:
        """A fresh observer for one upstream stream."""
        ...

    def error_body(self, err: GatewayError) -> bytes:
        """This API's error envelope."""
        ...

    def stream_error(self, err: GatewayError) -> bytes:
        """The SSE event(s) that end a stream that failed midway, in this API's shape."""
        ...

    def input_messages(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The prompt as GenAI `gen_ai.input.messages` (role + parts); spans call it only on opt-in."""
        ...

    def warm_request(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """The request that pre-warms `body`'s stable prefix (what every turn of its session repeats), or None."""
        ...

    def warm_history(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """The request that pre-warms `body`'s whole conversation so far (what its session's next turn starts
        with), as warm_request does its prefix, or None (too long, or nothing beyond the prefix to replay)."""
        ...

    def reply_usage(self, doc: Mapping[str, Any]) -> Usage:
        """The usage a complete reply body reports."""
        ...


def positive_int(body: Mapping[str, Any], key: str) -> None:
    """400 unless body[key] is absent or a positive integer."""
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"'{key}' must be a positive integer", param=key)


def number_in(body: Mapping[str, Any], key: str, lo: float, hi: float) -> None:
    """400 unless body[key] is absent or a number in [lo, hi]."""
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise bad_request(f"'{key}' must be a number between {lo:g} and {hi:g}", param=key)


def stream_flag(body: Mapping[str, Any]) -> bool:
    """The body's `stream` field (400 unless a boolean)."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    return stream


def usage_count(obj: Mapping[str, Any], key: str) -> int:
    """A token count from a usage object (0 when absent or not a number)."""
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def leading_then_user(items: Any, leading_roles: frozenset[str]) -> list[dict[str, Any]] | None:
    """The leading items whose role is in `leading_roles` and the first user item after them, or None when the
    first other item is not a user's (a prompt needs one; its blocks are the last and the cheapest)."""
    if not isinstance(items, list):
        return None
    head: list[dict[str, Any]] = []
    for item in items:
        role = item.get("role") if isinstance(item, dict) else None
        if role in leading_roles:
            head.append(item)
            continue
        return [*head, item] if role == "user" else None
    return None


def warm_within(path: str, body: Mapping[str, Any], out: dict[str, Any], fields: tuple[str, ...], chars: int,
                max_chars: int) -> WarmRequest | None:  # fmt: skip
    """`out` plus the `fields` of `body` that are set, as a WarmRequest to `path`, if the prefix (`chars` of text
    plus the tools' JSON) is at most `max_chars`."""
    for name in fields:
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("tools"):
        chars += len(orjson.dumps(body["tools"]))
    return WarmRequest(path, out, chars) if chars <= max_chars else None


def usage_in(doc: Mapping[str, Any], capture: Callable[[Mapping[str, Any] | None, Usage], None]) -> Usage:
    """A fresh Usage with what `capture` (the surface's usage reader) finds in a reply's `usage`."""
    usage, out = doc.get("usage"), Usage()
    capture(usage if isinstance(usage, Mapping) else None, out)
    return out


def record_usage(into: Usage, prompt: int, completion: int, cached: int) -> None:
    """Store reported token counts (cached ⊆ prompt)."""
    into.prompt_tokens = prompt
    into.completion_tokens = completion
    into.cached_tokens = cached
    into.reported = True
