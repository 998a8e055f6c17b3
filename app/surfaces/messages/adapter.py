"""POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages, as vLLM serves it): Claude Code.

Every error on these paths leaves in Anthropic's envelope `{"type":"error","error":{"type","message"}}`
with the status the Anthropic SDK maps to its exception classes — kvgate's own errors and vLLM's (vLLM
answers body-validation errors in OpenAI's envelope and its handler errors with its own type names).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from app.errors import GatewayError, bad_request
from app.prefix_key import HEAD_CHARS
from app.prompt import HeadBuilder, PromptView, TextSlot, content_chars, text_of, text_slots
from app.records import Operation, Usage
from app.surfaces.base import (
    Parsed,
    WarmRequest,
    leading_then_user,
    number_in,
    positive_int,
    record_usage,
    stream_flag,
    usage_count,
    usage_in,
    warm_within,
)
from app.surfaces.exchange import Exchange
from app.surfaces.messages.migration import MESSAGES_MIGRATION
from app.surfaces.messages.wire import BILLING_HEADER, ROLES, anthropic_error, anthropic_error_type, unexpected_role
from app.surfaces.migration import Migration
from app.surfaces.openai import rewrite_model
from app.surfaces.placement import TailPlacement, render_block
from app.surfaces.sse import NamedEventObserver, event_doc, event_parts, named_event

TOKENS_PER_MESSAGE = 4
_SYSTEM_ROLE = frozenset({"system"})
# What vLLM renders of a Messages body besides system and messages (thinking "disabled" and output_config's
# effort become the template's reasoning_effort; an enabled thinking budget is a sampling parameter only).
_RENDER_FIELDS = ("system", "tools", "tool_choice", "chat_template_kwargs")


def _after_billing_line(text: str) -> str | None:
    """The text after Claude Code's per-request billing line when a system block starts with it, else None."""
    if not text.startswith(BILLING_HEADER):
        return None
    _, _, rest = text.partition("\n")
    return rest.strip()


def _system_slots(slots: list[TextSlot], head: list[TextSlot], key: HeadBuilder) -> None:
    """System text blocks into the head and the routing key, as vLLM renders them."""
    for slot in slots:
        rest = _after_billing_line(slot.text)
        if rest is None:
            head.append(slot)
            key.add(slot.text)
        elif rest:
            # vLLM drops a block that starts with the billing line, whatever follows it: moving the line out
            # keeps the rest of the block in the prompt.
            head.append(slot)
            key.add(rest)
        # A block that is only the billing line: vLLM drops it; routing and normalize leave it alone.


def capture_messages_usage(usage: Mapping[str, Any] | None, into: Usage) -> None:
    """Anthropic usage: input_tokens excludes cache reads and writes, so the prompt is their sum."""
    if not usage:
        return
    read = usage_count(usage, "cache_read_input_tokens")
    prompt = usage_count(usage, "input_tokens") + read + usage_count(usage, "cache_creation_input_tokens")
    record_usage(into, prompt, usage_count(usage, "output_tokens"), read)


def _block_chars(content: Any) -> int:
    if not isinstance(content, list):
        return content_chars(content)
    chars = 0
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            chars += len(block["text"])
        elif kind == "tool_use":
            chars += len(orjson.dumps(block.get("input")))
        elif kind == "tool_result":
            chars += _block_chars(block.get("content"))
    return chars


class MessagesObserver(NamedEventObserver):
    """Relays Messages events untouched but for the model name; message_delta's usage is final (message_start's
    counts the prompt only)."""

    def observe(self, event: bytes) -> bytes | None:
        """Account for one event: id and prompt size at message_start, output and cache at message_delta."""
        ctx = self._ctx
        name, data = event_parts(event)
        if name == b"content_block_delta":
            self._token()
        elif name == b"message_start":
            doc = event_doc(data)
            message = doc.get("message") if doc is not None else None
            if isinstance(message, dict):
                if isinstance(message.get("id"), str):
                    ctx.response_id = message["id"]
                usage = message.get("usage")
                capture_messages_usage(usage if isinstance(usage, dict) else None, ctx.usage)
                # The prompt is known from here, the output only from message_delta: until it comes, a cut or
                # abandoned stream is billed for the deltas relayed (app/relay.py), not for message_start's 0.
                ctx.usage.reported = False
        elif name == b"message_delta":
            doc = event_doc(data)
            if doc is not None:
                usage = doc.get("usage")
                if isinstance(usage, dict):
                    capture_messages_usage(usage, ctx.usage)
                delta = doc.get("delta")
                if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                    ctx.finish_reasons.append(delta["stop_reason"])
        elif name == b"message_stop":
            self.done = True
        elif name == b"error":
            ctx.error_type = "upstream_stream_error"
            self.done = True
        return self._relay(event)


class MessagesSurface:
    """`system`, `messages` of content blocks, `tools`; errors in Anthropic's envelope."""

    name = "messages"
    operation: Operation = "chat"
    can_stream = True
    normalizable = True
    has_tools = True
    template_kwargs = False
    output_cap_fields: tuple[str, ...] = ("max_tokens",)
    forward: tuple[str, ...] = ("anthropic-version", "anthropic-beta")
    migration: Migration | None = MESSAGES_MIGRATION
    stores_responses = False
    hashes_blocks = False
    require_max_tokens = True

    def continues(self, body: Mapping[str, Any]) -> str | None:
        """None: a Messages conversation travels whole in every request."""
        return None

    def validate(self, body: dict[str, Any]) -> Parsed:
        """`messages` of {role, content}; `max_tokens` required; `system` a string or text blocks."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("messages: must be a non-empty array", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise bad_request(f"messages.{i}: Input should be a valid dictionary", param=f"messages.{i}")
            if m.get("role") not in ROLES:
                raise bad_request(unexpected_role(i, m.get("role")), param=f"messages.{i}.role")
            if not isinstance(m.get("content"), str | list):
                raise bad_request(f"messages.{i}.content: must be a string or an array of content blocks")
        system = body.get("system")
        if system is not None and not isinstance(system, str | list):
            raise bad_request("system: must be a string or an array of text blocks", param="system")
        if self.require_max_tokens and body.get("max_tokens") is None:
            raise bad_request("max_tokens: Field required", param="max_tokens")
        positive_int(body, "max_tokens")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise bad_request("tools: must be an array", param="tools")
        stream = stream_flag(body)
        number_in(body, "temperature", 0, 1)
        number_in(body, "top_p", 0, 1)
        return Parsed(stream, True)

    def view(self, body: Mapping[str, Any]) -> PromptView:
        """The system text (string or blocks), then the first user message."""
        head: list[TextSlot] = []
        key = HeadBuilder(HEAD_CHARS)
        system = body.get("system")
        chars = 0
        if isinstance(system, str):
            head.append(TextSlot(("system",), system, -1, -1))
            key.add(system)
        elif isinstance(system, list):
            _system_slots(text_slots(-1, system, ("system",)), head, key)
        chars += content_chars(system)
        tools = body.get("tools")
        tools_json = orjson.dumps(tools) if tools else b""
        tool_chars = len(tools_json)
        if tools_json:
            key.add_serialized(tools_json)
        messages = body.get("messages")
        if not isinstance(messages, list):
            messages = []
        framing = 0
        first_user: int | None = None
        last_user: int | None = None
        head_turns: list[int] = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                continue
            framing += TOKENS_PER_MESSAGE
            content = msg.get("content")
            chars += _block_chars(content)
            role = msg.get("role")
            if role == "system" and first_user is None and i == len(head_turns):
                # A system turn before any other is the system prompt's continuation; a later one is history.
                head_turns.append(i)
                _system_slots(text_slots(i, content, ("messages", i, "content")), head, key)
            elif role == "user":
                last_user = i
                if first_user is None:
                    first_user = i
                    head.extend(text_slots(i, content, ("messages", i, "content")))
                    key.add(text_of(content))
        refs: tuple[str, ...] = ()
        if last_user is not None and last_user != first_user:
            refs = tuple(s.text for s in text_slots(last_user, messages[last_user].get("content"), ()))
        return PromptView(
            head=tuple(head), tail_refs=refs, key_head=key.text(), text_chars=chars, framing_tokens=framing,
            tool_chars=tool_chars, restatable=last_user is not None,
        )  # fmt: skip

    def place_tail(self, body: dict[str, Any], lines: list[str], placement: TailPlacement) -> dict[str, Any]:
        """A trailing text block of the last user message (Anthropic keeps system first, always)."""
        block = render_block(lines)
        messages = list(body["messages"])
        for i in range(len(messages) - 1, -1, -1):
            msg = messages[i]
            if isinstance(msg, dict) and msg.get("role") == "user":
                content = msg.get("content")
                if isinstance(content, str):
                    new: Any = [{"type": "text", "text": content}, {"type": "text", "text": block}]
                else:
                    new = [*(content if isinstance(content, list) else []), {"type": "text", "text": block}]
                messages[i] = {**msg, "content": new}
                break
        return {**body, "messages": messages}

    def warm_request(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """The system prompt, the tools and the first user message, with what vLLM renders; one token."""
        head = leading_then_user(body.get("messages"), _SYSTEM_ROLE)
        return None if head is None else self._warm(body, head, max_chars)

    def warm_history(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """The whole conversation so far (every message, up to the newest user turn), as warm_request."""
        messages = body.get("messages")
        if not isinstance(messages, list) or len(messages) < 2 or not isinstance(messages[0], dict):
            return None  # a first turn is its prefix
        return self._warm(body, list(messages), max_chars)

    def _warm(self, body: Mapping[str, Any], messages: list[dict[str, Any]], max_chars: int) -> WarmRequest | None:
        out: dict[str, Any] = {"messages": messages, "max_tokens": 1, "stream": False}
        thinking, config = body.get("thinking"), body.get("output_config")
        if isinstance(thinking, dict) and thinking.get("type") == "disabled":
            out["thinking"] = thinking  # enabled needs a budget below max_tokens, and renders nothing
        if isinstance(config, dict) and config.get("effort") is not None:
            out["output_config"] = {"effort": config["effort"]}
        chars = content_chars(body.get("system"))
        chars += sum(_block_chars(m.get("content")) for m in messages if isinstance(m, dict))
        return warm_within("/v1/messages", body, out, _RENDER_FIELDS, chars, max_chars)

    def reply_usage(self, doc: Mapping[str, Any]) -> Usage:
        """A message's `usage` (cache reads and writes counted into the prompt)."""
        return usage_in(doc, capture_messages_usage)

    def upstream_body(
        self, body: dict[str, Any], *, served_model: str, priority: int | None, cache_salt: str | None
    ) -> dict[str, Any]:
        """The served model name and vLLM's `cache_salt` (vLLM's Messages request has no `priority`)."""
        if served_model == body.get("model") and cache_salt is None:
            return body
        out = {**body, "model": served_model}
        if cache_salt is not None:
            out["cache_salt"] = cache_salt
        return out

    def read_reply(self, doc: Mapping[str, Any], ctx: Exchange) -> None:
        """Usage, id and stop reason of a complete message."""
        usage = doc.get("usage")
        capture_messages_usage(usage if isinstance(usage, Mapping) else None, ctx.usage)
        rid = doc.get("id")
        ctx.response_id = rid if isinstance(rid, str) else None
        if isinstance(doc.get("stop_reason"), str):
            ctx.finish_reasons.append(doc["stop_reason"])

    def public_body(self, body: bytes, served: str, public: str) -> bytes:
        """The body with the public model name."""
        return rewrite_model(body, served, public)

    def upstream_error(self, status: int, body: bytes) -> bytes:
        """vLLM's error body in Anthropic's envelope (its message kept, its type mapped by status)."""
        doc = event_doc(body)
        message = "upstream error"
        if doc is not None:
            err = doc.get("error")
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                message = err["message"]
        return anthropic_error(status, message)

    def stream_observer(self, ctx: Exchange, served: str) -> MessagesObserver:
        """Messages' event observer."""
        return MessagesObserver(ctx, served)

    def error_body(self, err: GatewayError) -> bytes:
        """Anthropic's envelope."""
        return anthropic_error(err.status, err.message)

    def stream_error(self, err: GatewayError) -> bytes:
        """Anthropic's `error` event."""
        return named_event("error", {"type": "error", "error": {"type": anthropic_error_type(err.status),
                                                                 "message": err.message}})  # fmt: skip

    def input_messages(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """System, then each message's text, tool_use and tool_result blocks."""
        out: list[dict[str, Any]] = []
        system = body.get("system")
        if system:
            out.append({"role": "system", "parts": [{"type": "text", "content": text_of(system) or system}]})
        for msg in body.get("messages") or ():
            if not isinstance(msg, dict):
                continue
            content = msg.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
            parts: list[dict[str, Any]] = []
            for b in blocks:
                if not isinstance(b, dict):
                    continue
                kind = b.get("type")
                if kind == "text":
                    parts.append({"type": "text", "content": b.get("text", "")})
                elif kind == "tool_use":
                    parts.append({"type": "tool_call", "id": b.get("id"), "name": b.get("name"),
                                  "arguments": b.get("input")})  # fmt: skip
                elif kind == "tool_result":
                    parts.append({"type": "tool_call_response", "id": b.get("tool_use_id"),
                                  "response": b.get("content")})  # fmt: skip
                else:
                    parts.append({"type": str(kind)})
            out.append({"role": str(msg.get("role", "user")), "parts": parts})
        return out


class CountTokensSurface(MessagesSurface):
    """POST /v1/messages/count_tokens: the same body without max_tokens, answered by a replica, never streamed."""

    name = "messages_count_tokens"
    can_stream = False
    normalizable = False
    migration: Migration | None = None
    require_max_tokens = False

    def validate(self, body: dict[str, Any]) -> Parsed:
        """As a Messages body, with `stream` dropped: the engine answers count_tokens in JSON whatever the body
        says, and a stream the gateway waited for that never came would be counted against the replica."""
        super().validate(body)
        body.pop("stream", None)
        return Parsed(False, True)

    def warm_request(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """None: counting tokens fills no cache."""
        return None

    def warm_history(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """None: counting tokens fills no cache."""
        return None
