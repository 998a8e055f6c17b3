"""Chat streams: a cut stream continues on another replica, spliced into the client's.

When a replica dies after the first byte, the request is sent again as the original messages plus the text
generated so far as a partial assistant turn (`continue_final_message: true`, `add_generation_prompt: false`,
the output cap lowered by what was sent), and the new stream is rewritten to look like the old one: same id,
created and model, no second role chunk, usage summed. Streams whose continuation could not be faithful are
not migrated and end with an error event, as before: n > 1, logprobs asked for, a tool call half-streamed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.surfaces.exchange import Exchange
from app.surfaces.migration import Delivered, HeldBack, Migration, Resend, lowered_caps, same_endpoint
from app.surfaces.sse import event_doc

_OUTPUT_CAPS = ("max_completion_tokens", "max_tokens")


def delivered(events: Sequence[bytes]) -> Delivered:
    """Parse the relayed events of a chat stream (only on a failure: the relay itself does not parse)."""
    out = Delivered()
    parts: list[str] = []
    for event in events:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            doc = event_doc(line[5:].strip())
            if doc is None:
                continue
            if out.id is None and isinstance(doc.get("id"), str):
                out.id = doc["id"]
                created = doc.get("created")
                out.created = created if isinstance(created, int) else None
            for choice in doc.get("choices") or ():
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") or {}
                if isinstance(delta, dict):
                    if delta.get("tool_calls"):
                        out.tool_call = True
                    content = delta.get("content")
                    if isinstance(content, str) and content:
                        parts.append(content)
                        out.chunks += 1
                if choice.get("finish_reason"):
                    out.finished = True
    out.text = "".join(parts)
    return out


def not_migratable(body: Mapping[str, Any], got: Delivered) -> str | None:
    """Why this stream cannot be continued faithfully elsewhere (a metric label), or None when it can."""
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        return "n"
    if body.get("logprobs") or body.get("top_logprobs"):
        return "logprobs"
    return got.blocker()


def continuation(body: Mapping[str, Any], text: str, sent_tokens: int) -> dict[str, Any]:
    """The body that continues `text` as the assistant's unfinished turn, with the output cap lowered."""
    messages = list(body["messages"])
    last = messages[-1] if messages else None
    if isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str):
        messages[-1] = {**last, "content": last["content"] + text}  # the client's own prefill, extended
    else:
        messages.append({"role": "assistant", "content": text})
    return {**body, "messages": messages, "continue_final_message": True, "add_generation_prompt": False,
            **lowered_caps(body, _OUTPUT_CAPS, sent_tokens)}  # fmt: skip


@dataclass(slots=True)
class Splice:
    """Rewrites a continuation stream's events into the original stream's identity and usage."""

    orig_id: str
    orig_created: int | None
    sent_tokens: int
    held: HeldBack = field(default_factory=lambda: HeldBack(""))
    new_id: bytes | None = None
    new_created: bytes | None = None
    first: bool = True
    _seen: list[bytes] = field(default_factory=list)

    def rewrite(self, event: bytes) -> list[bytes]:
        """One event of the new stream as the client must see it (none: dropped)."""
        if not event.startswith(b"data:") or event.startswith(b"data: [DONE]"):
            return [event]
        if self.new_id is None:
            doc = event_doc(event[5:].strip())
            if doc is None:
                return [event]
            self.new_id = orjson.dumps(doc.get("id"))
            created = doc.get("created")
            self.new_created = str(created).encode() if isinstance(created, int) else None
            if self.first and _role_only(doc):
                self.first = False
                return []  # the client already had its role chunk
        self.first = False
        if self.held.held and b'"content":' in event:
            event = self._drop_held(event)
        event = event.replace(b'"id":' + self.new_id, b'"id":' + orjson.dumps(self.orig_id))
        if self.new_created is not None and self.orig_created is not None:
            event = event.replace(b'"created":' + self.new_created, b'"created":' + str(self.orig_created).encode())
        if b'"usage":{' in event:
            event = self._sum_usage(event)
        return [event]

    def _drop_held(self, event: bytes) -> bytes:
        doc = event_doc(event[5:].strip())
        if doc is None:
            return event
        for choice in doc.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                delta["content"] = self.held.text(delta["content"])
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    def _sum_usage(self, event: bytes) -> bytes:
        doc = event_doc(event[5:].strip())
        usage = doc.get("usage") if doc is not None else None
        if doc is None or not isinstance(usage, dict):
            return event
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            # The continuation's prompt holds the delivered text: those tokens were output, not input.
            usage["prompt_tokens"] = max(prompt - self.sent_tokens, 0)
            usage["completion_tokens"] = completion + self.sent_tokens
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                details["cached_tokens"] = min(details["cached_tokens"], usage["prompt_tokens"])
        return b"data: " + orjson.dumps(doc) + b"\n\n"


def _role_only(doc: Mapping[str, Any]) -> bool:
    for choice in doc.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and delta.get("role") and not delta.get("content") and not delta.get("tool_calls"):
            return True
    return False


def resend(ctx: Exchange, got: Delivered, sent_tokens: int, served: str, priority: int | None) -> Resend:
    """The original body plus the partial assistant turn, to the same path."""
    return same_endpoint(ctx, continuation(ctx.body, got.resume_text(), sent_tokens), served, priority)


def splice(got: Delivered, sent_tokens: int) -> Splice:
    """Same id and created, no second role chunk, usage summed."""
    return Splice(got.id or "", got.created, sent_tokens, HeldBack(got.held_back()))


# Chat completions continue on the same endpoint: vLLM's `continue_final_message` takes the partial turn.
CHAT_MIGRATION = Migration(delivered, not_migratable, resend, splice)
