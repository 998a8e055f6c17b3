"""What the OpenAI-style surfaces share: the error envelope, `usage`, `choices`, the chunk stream with [DONE]."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from app.errors import GatewayError, bad_request, error_body
from app.records import Usage
from app.surfaces.base import (
    Parsed,
    StreamObserver,
    WarmRequest,
    int_in,
    number_in,
    positive_int,
    record_usage,
    stream_flag,
    usage_count,
    usage_in,
)
from app.surfaces.exchange import Exchange
from app.surfaces.sse import ModelRewrite, event_parts

if TYPE_CHECKING:
    from app.surfaces.migration import Migration

_COMPACT_DATA = b"data: {"
_BARE_DATA = b"data:{"
_USAGE, _USAGE_NULL = b'"usage"', b'"usage":null'
_FINISH, _FINISH_NULL = b'"finish_reason"', b'"finish_reason":null'
_FINISH_NULL_LEN = len(_FINISH_NULL)
# OpenAI's bounds on the request multipliers (vLLM's default max_logprobs is 20 too).
MAX_N = 128
MAX_BEST_OF = 20
MAX_LOGPROBS = 20
# The bounded sampling fields `validate` checks (most requests set none of them).
_BOUNDED = frozenset({"n", "best_of", "top_logprobs", "logprobs", "temperature", "top_p"})
# How much of a non-JSON upstream error body the client's envelope quotes.
_UPSTREAM_TEXT = 512


def capture_usage(usage_obj: Mapping[str, Any] | None, into: Usage) -> None:
    """Copy an OpenAI `usage` object (with vLLM's prompt_tokens_details) into the request record."""
    if not usage_obj:
        return
    details = usage_obj.get("prompt_tokens_details")
    cached = usage_count(details, "cached_tokens") if isinstance(details, Mapping) else 0
    record_usage(
        into, usage_count(usage_obj, "prompt_tokens"), usage_count(usage_obj, "completion_tokens"), cached
    )


def note_choices(ctx: Exchange, choices: object) -> bool:
    """Record finish reasons; True when a choice carried generated content."""
    produced = False
    if not isinstance(choices, list):
        return produced
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        reason = choice.get("finish_reason")
        if reason:
            ctx.finish_reasons.append(reason)
        delta = choice.get("delta")
        if (
            isinstance(delta, dict)
            and (delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"))
        ) or choice.get("text"):
            produced = True
    return produced


def rewrite_model(body: bytes, served: str, public: str) -> bytes:
    """Put the public model name back where the upstream wrote its served name, without re-serializing."""
    if served == public:
        return body
    return ModelRewrite(served, public).apply(body)


def plain_token_chunk(event: bytes) -> bool:
    """A mid-stream token chunk carries nothing to account for: no usage, finish reason or error.

    Checked on the bytes so most chunks are relayed without being parsed: vLLM's compact `"finish_reason":null`
    (and `"usage":null`) pass; any other spelling or value of those keys (or a second finish_reason, n > 1),
    or any `"error"` key, means parse.
    A key name inside a string value can only send a chunk to the parser, never past it.
    """
    i = event.find(_FINISH)
    return (
        (i < 0 or (event.startswith(_FINISH_NULL, i) and event.find(_FINISH, i + _FINISH_NULL_LEN) < 0))
        and b'"error"' not in event
        and (_USAGE not in event or event.count(_USAGE) == event.count(_USAGE_NULL))
    )


class ChunkObserver:
    """OpenAI's chunk stream: relayed untouched but for the model name; the usage-only chunk is dropped
    when the client did not ask for it (the gateway always does); `data: [DONE]` is sent after the trailer.

    Token chunks in vLLM's compact JSON skip the parser; anything else (spaced JSON, `data:` on a later
    line, a finish, usage or error chunk) is parsed, so detection does not depend on formatting.
    """

    __slots__ = ("_ctx", "_model", "_public_marker", "_served_marker", "delivered", "done")

    def __init__(self, ctx: Exchange, served: str) -> None:
        self._ctx = ctx
        self._model = ModelRewrite(served, ctx.model) if served != ctx.model else None
        # The fast path's markers, held here: attribute reads per chunk instead of a call.
        self._served_marker = self._model.served_marker if self._model is not None else b""
        self._public_marker = self._model.public_marker if self._model is not None else b""
        self.done = False
        self.delivered = 0

    def observe(self, event: bytes) -> bytes | None:
        """Account for one SSE event; return the bytes to forward, or None to drop it."""
        if (
            (event.startswith(_COMPACT_DATA) or event.startswith(_BARE_DATA))
            and self._ctx.timing.first_token
            # plain_token_chunk(), inlined: this runs for every token
            and ((i := event.find(_FINISH)) < 0
                 or (event.startswith(_FINISH_NULL, i) and event.find(_FINISH, i + _FINISH_NULL_LEN) < 0))
            and b'"error"' not in event
            and (_USAGE not in event or event.count(_USAGE) == event.count(_USAGE_NULL))
        ):
            self.delivered += 1
            if self._model is None:
                return event
            out = event.replace(self._served_marker, self._public_marker)
            # bytes.replace returns the same object when nothing matched: only then try other spellings.
            return out if out is not event else self._model.spaced(event)
        return self._parsed(event)

    def _parsed(self, event: bytes) -> bytes | None:
        ctx = self._ctx
        # One `data:` line first (as every engine writes chunks): orjson skips the whitespace around it.
        if event.startswith(b"data:") and b"\ndata:" not in event:
            data = event[5:]
        else:
            _, data = event_parts(event)
        if b"[DONE]" in data and data.strip() == b"[DONE]":
            self.done = True
            return None  # sent by ending(), after the trailer
        if not data.strip():
            return event  # a comment, or id:/retry: lines alone
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self._model.apply(event) if self._model is not None else event
        if not isinstance(doc, dict):
            return event
        if ctx.response_id is None:
            rid = doc.get("id")
            ctx.response_id = rid if isinstance(rid, str) else None
        usage = doc.get("usage")
        choices = doc.get("choices")
        if usage and isinstance(usage, dict):
            capture_usage(usage, ctx.usage)
        if note_choices(ctx, choices):
            self.delivered += 1
            if not ctx.timing.first_token:
                ctx.timing.first_token = time.perf_counter()
        if usage and not choices and not ctx.client_wants_usage:
            return None
        if "error" in doc:
            ctx.error_type = "upstream_stream_error"
        return self._model.apply(event) if self._model is not None else event

    def ending(self, trailer: bytes) -> bytes:
        """The trailer, then `data: [DONE]`."""
        return trailer + b"data: [DONE]\n\n"


class OpenAISurface:
    """Behaviour every OpenAI-style surface shares; subclasses say how to validate and view the prompt."""

    name = "openai"
    can_stream = True
    # Whether the body takes vLLM's `priority` and `cache_salt` (the pooling endpoints do not).
    schedules = True
    # Whether normalize may rewrite the prompt (embeddings: the vector must be of the text as sent).
    normalizable = True
    # The body's `tools` are canonicalized by normalize; `chat_template_kwargs` can pin the date.
    has_tools = False
    template_kwargs = False
    # Where the body caps its output, newest first (limits read and lower these).
    output_cap_fields: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
    migration: Migration | None = None
    stores_responses = False
    hashes_blocks = False
    forward: tuple[str, ...] = ()

    def continues(self, body: Mapping[str, Any]) -> str | None:
        """None: only the Responses API continues a stored response."""
        return None

    def validate(self, body: dict[str, Any]) -> Parsed:
        """Common OpenAI fields; always ask for the usage chunk on streams (limits and cost need it)."""
        self.validate_fields(body)
        stream = stream_flag(body)
        if stream and not self.can_stream:
            raise bad_request(f"{self.name} cannot be streamed", param="stream")
        positive_int(body, "max_tokens")
        if not _BOUNDED.isdisjoint(body):  # one C-level test spares six checks on a body that sets none of them
            int_in(body, "n", 1, MAX_N)
            int_in(body, "best_of", 1, MAX_BEST_OF)
            int_in(body, "top_logprobs", 0, MAX_LOGPROBS)
            if not isinstance(body.get("logprobs"), bool):  # chat's is a flag; completions' a count
                int_in(body, "logprobs", 0, MAX_LOGPROBS)
            number_in(body, "temperature", 0, 2)
            number_in(body, "top_p", 0, 1)
        wants_usage = False
        if stream:
            options = body.get("stream_options")
            if options is not None and not isinstance(options, dict):
                raise bad_request("'stream_options' must be an object", param="stream_options")
            wants_usage = bool(options and options.get("include_usage"))
            body["stream_options"] = {**(options or {}), "include_usage": True}
        return Parsed(stream, wants_usage)

    def validate_fields(self, body: dict[str, Any]) -> None:
        """The surface's own required fields."""

    def upstream_body(
        self, body: dict[str, Any], *, served_model: str, priority: int | None, cache_salt: str | None
    ) -> dict[str, Any]:
        """The body with the served model name, vLLM's `priority` and `cache_salt`."""
        if served_model == body.get("model") and (not self.schedules or (priority is None and cache_salt is None)):
            return body
        out = dict(body)
        out["model"] = served_model
        if self.schedules:
            if priority is not None:
                out["priority"] = priority
            if cache_salt is not None:
                out["cache_salt"] = cache_salt
        return out

    def read_reply(self, doc: Mapping[str, Any], ctx: Exchange) -> None:
        """Usage, id and finish reasons of a complete body."""
        usage = doc.get("usage")
        capture_usage(usage if isinstance(usage, Mapping) else None, ctx.usage)
        rid = doc.get("id")
        ctx.response_id = rid if isinstance(rid, str) else None
        note_choices(ctx, doc.get("choices"))

    def reply_usage(self, doc: Mapping[str, Any]) -> Usage:
        """`usage` of a complete body."""
        return usage_in(doc, capture_usage)

    def warm_request(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """None: only the chat-style surfaces have a prefix worth pre-warming."""
        return None

    def warm_history(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """None: only the chat-style surfaces have a conversation worth pre-warming."""
        return None

    def public_body(self, body: bytes, served: str, public: str) -> bytes:
        """The body with the public model name."""
        return rewrite_model(body, served, public)

    def upstream_error(self, status: int, body: bytes) -> bytes:
        """vLLM's own 4xx bodies are OpenAI's envelope already: passed through unchanged. FastAPI's
        `{"detail": …}` (a route the model does not serve, e.g. /v1/embeddings on a generative model) is put
        into the envelope, and so is a body that is not a JSON object (a proxy's text or HTML page): the client
        is told `application/json`, so it gets JSON in OpenAI's envelope."""
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            text = body[:_UPSTREAM_TEXT].decode("utf-8", "replace").strip()
            return error_body(f"The engine answered {status}: {text}" if text else f"The engine answered {status}.",
                              "invalid_request_error", None, "upstream_error")
        if "error" in doc or not isinstance(doc.get("detail"), str):
            return body
        if status == 404:
            return error_body(f"This model's replicas do not serve {self.name}.", "invalid_request_error", None,
                              "unknown_url")
        return error_body(doc["detail"], "invalid_request_error")

    def stream_observer(self, ctx: Exchange, served: str) -> StreamObserver:
        """OpenAI's chunk observer."""
        return ChunkObserver(ctx, served)

    def error_body(self, err: GatewayError) -> bytes:
        """OpenAI's envelope."""
        return err.body()

    def stream_error(self, err: GatewayError) -> bytes:
        """An SSE event with OpenAI's error envelope, as OpenAI ends a stream that failed."""
        return b"data: " + error_body(err.message, err.type, None, err.code or "upstream_error") + b"\n\n"


def media_free_parts(content: Any) -> list[dict[str, Any]]:
    """GenAI message parts of a content value: text verbatim, media by type only (no bytes or URLs)."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for item in content:
            if isinstance(item, dict) and item.get("type") == "text":
                parts.append({"type": "text", "content": item.get("text", "")})
            elif isinstance(item, dict):
                parts.append({"type": str(item.get("type", "unknown"))})
    return parts
