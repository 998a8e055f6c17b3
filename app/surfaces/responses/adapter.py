"""POST /v1/responses (the OpenAI Responses API, as vLLM serves it): Agents SDK and Codex-style clients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from app.errors import GatewayError, bad_request
from app.prefix_key import HEAD_CHARS
from app.prompt import HeadBuilder, Path, PromptView, TextSlot, content_chars, text_of, text_slots
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
from app.surfaces.migration import Migration
from app.surfaces.openai import OpenAISurface
from app.surfaces.placement import TailPlacement, render_block
from app.surfaces.responses.migration import RESPONSES_MIGRATION
from app.surfaces.sse import NamedEventObserver, event_doc, event_parts, named_event

_LEADING_ROLES = frozenset({"system", "developer"})
_TEXT_TYPES = ("input_text", "text", "output_text")
# Fields vLLM renders into the prompt (instructions as the system message, tools, reasoning effort, template
# kwargs), so a pre-warm renders to the same leading tokens.
_RENDER_FIELDS = ("instructions", "tools", "tool_choice", "reasoning", "chat_template_kwargs")
_FINAL_EVENTS = frozenset({b"response.completed", b"response.failed", b"response.incomplete"})
# Role and framing tokens per input item, as for chat messages.
TOKENS_PER_ITEM = 4


def capture_response_usage(usage: Mapping[str, Any] | None, into: Usage) -> None:
    """Responses usage: input_tokens (cached ⊆ input), input_tokens_details.cached_tokens, output_tokens."""
    if not usage:
        return
    details = usage.get("input_tokens_details")
    cached = usage_count(details, "cached_tokens") if isinstance(details, Mapping) else 0
    record_usage(into, usage_count(usage, "input_tokens"), usage_count(usage, "output_tokens"), cached)


def _item_text_chars(item: Any) -> int:
    if not isinstance(item, dict):
        return content_chars(item)
    chars = content_chars(item.get("content"))
    for field in ("arguments", "output"):
        value = item.get(field)
        if isinstance(value, str):
            chars += len(value)
    return chars


def _warm(body: Mapping[str, Any], items: str | list[Any], max_chars: int) -> WarmRequest | None:
    """`items` as the input of a one-token, unstored request with what vLLM renders of `body`."""
    chars = len(items) if isinstance(items, str) else sum(_item_text_chars(item) for item in items)
    if isinstance(body.get("instructions"), str):
        chars += len(body["instructions"])
    out: dict[str, Any] = {"input": items, "max_output_tokens": 1, "stream": False, "store": False}
    return warm_within("/v1/responses", body, out, _RENDER_FIELDS, chars, max_chars)


class ResponseObserver(NamedEventObserver):
    """Relays Responses events untouched but for the model name; usage comes with response.completed."""

    def observe(self, event: bytes) -> bytes | None:
        """Account for one event; the stream's response id, first token, usage and status."""
        ctx = self._ctx
        name, data = event_parts(event)
        if name == b"response.output_text.delta" or name == b"response.function_call_arguments.delta":
            self._token()
        elif name == b"response.created" or name in _FINAL_EVENTS:
            doc = event_doc(data)
            response = doc.get("response") if doc is not None else None
            if isinstance(response, dict):
                if ctx.response_id is None and isinstance(response.get("id"), str):
                    ctx.response_id = response["id"]
                if name in _FINAL_EVENTS:
                    self.done = True
                    usage = response.get("usage")
                    capture_response_usage(usage if isinstance(usage, dict) else None, ctx.usage)
                    status = response.get("status")
                    if isinstance(status, str):
                        ctx.finish_reasons.append(status)
        elif name == b"error":
            ctx.error_type = "upstream_stream_error"
            self.done = True
        return self._relay(event)


class ResponsesSurface(OpenAISurface):
    """`input` (a string or items), `instructions`, `tools`; named SSE events ending in response.completed."""

    name = "responses"
    operation: Operation = "chat"
    has_tools = True
    output_cap_fields: tuple[str, ...] = ("max_output_tokens",)
    migration: Migration | None = RESPONSES_MIGRATION
    stores_responses = True

    def continues(self, body: Mapping[str, Any]) -> str | None:
        """The body's `previous_response_id`: that response is stored on one replica, which must serve this."""
        previous = body.get("previous_response_id")
        return previous if isinstance(previous, str) else None

    def validate(self, body: dict[str, Any]) -> Parsed:
        """`input` is a string or a list of items; the usual numeric ranges."""
        value = body.get("input")
        if not isinstance(value, str | list):
            raise bad_request("'input' must be a string or an array of input items", param="input")
        if isinstance(value, list):
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise bad_request(f"input[{i}] must be an object", param=f"input[{i}]")
        for field in ("instructions", "previous_response_id"):
            if body.get(field) is not None and not isinstance(body[field], str):
                raise bad_request(f"'{field}' must be a string", param=field)
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise bad_request("'tools' must be an array", param="tools")
        stream = stream_flag(body)
        positive_int(body, "max_output_tokens")
        number_in(body, "temperature", 0, 2)
        number_in(body, "top_p", 0, 1)
        return Parsed(stream, True)

    def view(self, body: Mapping[str, Any]) -> PromptView:
        """Instructions, then the leading system/developer items and the first user item."""
        head: list[TextSlot] = []
        key = HeadBuilder(HEAD_CHARS)
        instructions = body.get("instructions")
        chars = 0
        if isinstance(instructions, str):
            head.append(TextSlot(("instructions",), instructions, -1, -1))
            key.add(instructions)
            chars += len(instructions)
        items = body.get("input")
        tools = body.get("tools")
        tools_json = orjson.dumps(tools) if tools else b""
        tool_chars = len(tools_json)
        if isinstance(items, str):
            head.append(TextSlot(("input",), items, 0, -1))
            if tools_json:
                key.add_serialized(tools_json)
            key.add(items)
            return PromptView(head=tuple(head), key_head=key.text(), text_chars=chars + len(items),
                              framing_tokens=TOKENS_PER_ITEM, tool_chars=tool_chars)  # fmt: skip
        if not isinstance(items, list):
            items = []
        first_user: int | None = None
        first_other: Any = None
        leading = True
        framing = 0
        last_user: int | None = None
        for i, item in enumerate(items):
            chars += _item_text_chars(item)
            framing += TOKENS_PER_ITEM
            if not isinstance(item, dict):
                leading = False
                continue
            role = item.get("role")
            content = item.get("content")
            path: Path = ("input", i, "content")
            if role == "user":
                last_user = i
            if leading and role in _LEADING_ROLES:
                key.add(text_of(content))
                head.extend(text_slots(i, content, path, _TEXT_TYPES))
                continue
            if leading:
                first_other = item
            leading = False
            if role == "user" and first_user is None:
                first_user = i
                head.extend(text_slots(i, content, path, _TEXT_TYPES))
        if tools_json:
            key.add_serialized(tools_json)
        if first_other is not None:
            key.add(text_of(first_other.get("content")))
        refs: tuple[str, ...] = ()
        if last_user is not None and last_user != first_user:
            refs = tuple(s.text for s in text_slots(last_user, items[last_user].get("content"), (), _TEXT_TYPES))
        return PromptView(
            head=tuple(head), tail_refs=refs, key_head=key.text(), text_chars=chars, framing_tokens=framing,
            tool_chars=tool_chars, restatable=last_user is not None,
        )  # fmt: skip

    def place_tail(self, body: dict[str, Any], lines: list[str], placement: TailPlacement) -> dict[str, Any]:
        """A trailing input_text part of the last user item (a string input gets the block appended)."""
        block = render_block(lines)
        items = body.get("input")
        if isinstance(items, str):
            return {**body, "input": items + "\n\n" + block}
        if isinstance(items, list):
            for i in range(len(items) - 1, -1, -1):
                item = items[i]
                if isinstance(item, dict) and item.get("role") == "user":
                    content = item.get("content")
                    if isinstance(content, str):
                        new: Any = content + "\n\n" + block
                    else:
                        new = [*(content or []), {"type": "input_text", "text": block}]
                    out = list(items)
                    out[i] = {**item, "content": new}
                    return {**body, "input": out}
        # No user item to carry the block: the instructions' tail takes it.
        instructions = body.get("instructions") or ""
        return {**body, "instructions": (instructions + "\n\n" if instructions else "") + block}

    def warm_request(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """Instructions, the leading system/developer items and the first user item (or a string input), and what
        vLLM renders; one token, and not stored (a replica must not keep a response nobody asked for)."""
        items = body.get("input")
        head: Any = items if isinstance(items, str) else leading_then_user(items, _LEADING_ROLES)
        return None if head is None else _warm(body, head, max_chars)

    def warm_history(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """Instructions and every input item so far, as warm_request; None for a string input (that is its
        prefix) and for a request that continues a stored response (its history is on the replica that stored
        it, out of the gateway's sight; previous_response_id pins those turns there anyway)."""
        items = body.get("input")
        if not isinstance(items, list) or len(items) < 2 or body.get("previous_response_id") is not None:
            return None
        return _warm(body, list(items), max_chars)

    def reply_usage(self, doc: Mapping[str, Any]) -> Usage:
        """A response object's `usage`."""
        return usage_in(doc, capture_response_usage)

    def read_reply(self, doc: Mapping[str, Any], ctx: Exchange) -> None:
        """Usage, id and status of a complete response object."""
        usage = doc.get("usage")
        capture_response_usage(usage if isinstance(usage, Mapping) else None, ctx.usage)
        rid = doc.get("id")
        ctx.response_id = rid if isinstance(rid, str) else None
        status = doc.get("status")
        if isinstance(status, str):
            ctx.finish_reasons.append(status)

    def stream_observer(self, ctx: Exchange, served: str) -> ResponseObserver:
        """Responses' event observer."""
        return ResponseObserver(ctx, served)

    def stream_error(self, err: GatewayError) -> bytes:
        """Responses' `error` event."""
        doc = {"type": "error", "code": err.code or "upstream_error", "message": err.message, "param": None,
               "sequence_number": -1}  # fmt: skip
        return named_event("error", doc)

    def input_messages(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Instructions as a system message, then each input item by role (function items by type)."""
        out: list[dict[str, Any]] = []
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            out.append({"role": "system", "parts": [{"type": "text", "content": instructions}]})
        items = body.get("input")
        if isinstance(items, str):
            return [*out, {"role": "user", "parts": [{"type": "text", "content": items}]}]
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "function_call":
                out.append({"role": "assistant", "parts": [
                    {"type": "tool_call", "id": item.get("call_id"), "name": item.get("name"),
                     "arguments": item.get("arguments")}]})  # fmt: skip
            elif kind == "function_call_output":
                out.append({"role": "tool", "parts": [
                    {"type": "tool_call_response", "id": item.get("call_id"),
                     "response": item.get("output")}]})  # fmt: skip
            else:
                slots = text_slots(0, item.get("content"), (), _TEXT_TYPES)
                parts = [{"type": "text", "content": t.text} for t in slots]
                out.append({"role": str(item.get("role", "user")), "parts": parts})
        return out
