"""Messages streams: a cut stream continues on another replica through /v1/chat/completions, as Messages events.

vLLM 0.32's Messages endpoint cannot continue a partial assistant turn, so the continuation is the chat
request vLLM would have made of the Messages body (app/surfaces/messages/to_chat.py) with the delivered text as
the unfinished assistant turn (`continue_final_message`). Its chunks are turned into the client's Messages
events: text deltas go on in the open text block (same index; no second message_start or
content_block_start), a tool call becomes a tool_use block at the next index, and the stream ends with
content_block_stop, message_delta (the stop reason, usage summed) and message_stop.
Not migrated: a tool_use or thinking block half-streamed, extended thinking asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.surfaces.chat.adapter import ChatSurface
from app.surfaces.exchange import Exchange
from app.surfaces.messages.to_chat import chat_request
from app.surfaces.messages.wire import anthropic_error_type
from app.surfaces.migration import Delivered, HeldBack, Migration, Resend, int_at, lowered_caps, member, named_docs
from app.surfaces.sse import event_doc, event_parts, named_event

CHAT_PATH = "/v1/chat/completions"
_CHAT = ChatSurface()  # stateless: the chat request a Messages stream continues as
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


@dataclass(slots=True)
class MessagesDelivered(Delivered):
    """The client's stream so far: the open content block and the next block index."""

    open_index: int | None = None  # the text block the continuation writes into (None: none open)
    next_index: int = 0


def delivered(events: Sequence[bytes]) -> MessagesDelivered:
    """Parse the relayed Messages events."""
    out = MessagesDelivered()
    parts: list[str] = []
    for name, doc in named_docs(events):
        index = doc.get("index")
        if name == b"message_start":
            mid = member(doc, "message").get("id")
            out.id = mid if isinstance(mid, str) else None
        elif name == b"content_block_start" and isinstance(index, int):
            block = member(doc, "content_block")
            kind = block.get("type")
            out.next_index = max(out.next_index, index + 1)
            out.open_index = index if kind == "text" else None
            if kind in ("thinking", "redacted_thinking"):
                out.unfaithful = out.unfaithful or "reasoning"
            elif kind != "text":
                out.tool_call = True
        elif name == b"content_block_delta":
            delta = member(doc, "delta")
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str) and delta["text"]:
                parts.append(delta["text"])
                out.chunks += 1
        elif name == b"content_block_stop" and index == out.open_index:
            out.open_index = None
        elif name in (b"message_delta", b"message_stop"):
            out.finished = True
    out.text = "".join(parts)
    return out


def not_migratable(body: Mapping[str, Any], got: Delivered) -> str | None:
    """Why this Messages stream cannot continue faithfully elsewhere, or None."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"):
        return "reasoning"  # the continuation would have to resume a thinking budget midway
    return got.blocker()


def anthropic_usage(usage: Mapping[str, Any], sent_tokens: int) -> dict[str, Any] | None:
    """A chat usage object as Anthropic's (vLLM's _build_anthropic_usage), the delivered tokens moved to output."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    prompt = max(prompt - sent_tokens, 0)
    out: dict[str, Any] = {"input_tokens": prompt, "output_tokens": completion + sent_tokens}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        read, created = details.get("cached_tokens"), details.get("created_cache_tokens")
        if isinstance(read, int):
            out["cache_read_input_tokens"] = read = min(read, prompt)
            prompt -= read
        if isinstance(created, int):
            out["cache_creation_input_tokens"] = created = min(created, prompt)
            prompt -= created
        out["input_tokens"] = prompt
    return out


def continuation(body: Mapping[str, Any], text: str, sent_tokens: int) -> dict[str, Any]:
    """vLLM's chat request for the Messages body, the delivered text its unfinished assistant turn."""
    chat = chat_request(body)
    # A client's own trailing assistant message was a turn of its own to vLLM's Messages (it adds a generation
    # prompt after it): the delivered text is a new turn, never an extension of that one.
    chat["messages"].append({"role": "assistant", "content": text})
    chat.update(continue_final_message=True, add_generation_prompt=False)
    chat.update(lowered_caps(body, ("max_tokens",), sent_tokens))
    return chat


class MessagesSplice:
    """Turns a continuation's chat chunks into the client's Messages events."""

    def __init__(self, got: MessagesDelivered, sent_tokens: int) -> None:
        self._sent = sent_tokens
        self._held = HeldBack(got.held_back())
        self._open = got.open_index
        self._open_kind = "text" if got.open_index is not None else ""
        self._next = got.next_index
        self._tools: dict[int, int] = {}  # chat tool_call index -> block index
        self._stop: str | None = None
        self._stop_sequence: str | None = None
        self._ended = False

    def rewrite(self, event: bytes) -> list[bytes]:
        """The Messages events for one chat chunk."""
        if self._ended:
            return []
        _, data = event_parts(event)
        if data == b"[DONE]":
            return self._end(None)
        doc = event_doc(data) if data else None
        if doc is None:
            return []
        if isinstance(doc.get("error"), dict):
            self._ended = True
            err = doc["error"]
            kind = anthropic_error_type(int_at(err, "code") or 500)
            return [named_event("error", {"type": "error",
                                          "error": {"type": kind, "message": str(err.get("message", ""))}})]
        out: list[bytes] = []
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict):
                out += self._choice(choice)
        usage = doc.get("usage")
        if isinstance(usage, dict) and not doc.get("choices"):
            out += self._end(usage)
        return out

    def _choice(self, choice: Mapping[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        delta = member(choice, "delta")
        text = delta.get("content")
        text = self._held.text(text) if isinstance(text, str) else None
        if text:
            out += self._start("text", {"type": "text", "text": ""})
            out.append(named_event("content_block_delta", {"type": "content_block_delta", "index": self._open,
                                                           "delta": {"type": "text_delta", "text": text}}))  # fmt: skip
        for call in delta.get("tool_calls") or ():
            out += self._tool_call(call) if isinstance(call, dict) else []
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            stop = choice.get("stop_reason")
            self._stop_sequence = stop if isinstance(stop, str) and reason == "stop" else None
            tool_used = bool(self._tools) and reason != "length"
            self._stop = ("stop_sequence" if self._stop_sequence else "tool_use" if tool_used
                          else _STOP_REASONS.get(reason, "end_turn"))  # fmt: skip
            out += self._close()
        return out

    def _tool_call(self, call: Mapping[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        index = int_at(call, "index") or 0
        fn = member(call, "function")
        if index not in self._tools:
            name = fn.get("name") or ""
            block: dict[str, Any] = {"type": "tool_use", "id": call.get("id") or f"toolu_{index}", "name": name,
                                     "input": {}}  # fmt: skip
            out += self._close()
            out += self._start("tool_use", block)
            self._tools[index] = self._next - 1
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            out.append(named_event("content_block_delta", {"type": "content_block_delta", "index": self._tools[index],
                                                           "delta": {"type": "input_json_delta",
                                                                     "partial_json": args}}))  # fmt: skip
        return out

    def _start(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        if self._open is not None and self._open_kind == kind and kind == "text":
            return []
        out = self._close()
        self._open, self._open_kind = self._next, kind
        self._next += 1
        return [*out, named_event("content_block_start", {"type": "content_block_start", "index": self._open,
                                                          "content_block": block})]  # fmt: skip

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        return [named_event("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _end(self, usage: Mapping[str, Any] | None) -> list[bytes]:
        self._ended = True
        summed = anthropic_usage(usage, self._sent) if usage is not None else None
        delta = {"type": "message_delta", "delta": {"stop_reason": self._stop or "end_turn",
                                                    "stop_sequence": self._stop_sequence},
                 "usage": summed or {"output_tokens": self._sent}}  # fmt: skip
        stop = named_event("message_stop", {"type": "message_stop"})
        return [*self._close(), named_event("message_delta", delta), stop]


def resend(ctx: Exchange, got: Delivered, sent_tokens: int, served: str, priority: int | None) -> Resend:
    """vLLM's chat request for the body, plus the partial assistant turn, to the chat endpoint."""
    body = continuation(ctx.body, got.resume_text(), sent_tokens)
    return Resend(CHAT_PATH, _CHAT.upstream_body(body, served_model=served, priority=priority,
                                                cache_salt=ctx.cache_salt))  # fmt: skip


def splice(got: Delivered, sent_tokens: int) -> MessagesSplice:
    """Chat chunks to the client's Messages events."""
    assert isinstance(got, MessagesDelivered)
    return MessagesSplice(got, sent_tokens)


# Messages continue through /v1/chat/completions (continue_final_message), spliced as Messages events.
MESSAGES_MIGRATION = Migration(delivered, not_migratable, resend, splice)
