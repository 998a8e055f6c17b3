"""Responses streams: a cut stream continues on another replica's /v1/responses, spliced into the client's.

vLLM 0.32 continues a final input item that is an assistant message with status `in_progress` (its
`should_continue_final_message`: `continue_final_message` on, no generation prompt), so the continuation is
the original request with the delivered text appended as that item. The new stream is rewritten into the
client's: its response.created / in_progress and the added events of the item the client already has are
dropped, item ids and output indexes are mapped to the client's, `sequence_number` continues where the
client's stopped, the done events and response.completed carry the whole text, and usage is summed.
Not migrated: a function call, reasoning or a second output item half-streamed, logprobs asked for, and a
`previous_response_id` (its state lives on the replica that stored it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.surfaces.exchange import Exchange
from app.surfaces.migration import (
    Delivered,
    HeldBack,
    Migration,
    Resend,
    after_held,
    int_at,
    lowered_caps,
    member,
    named_docs,
    same_endpoint,
)
from app.surfaces.sse import event_doc, event_parts, named_event

_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_HEAD = frozenset({"response.created", "response.in_progress", "response.queued"})
_LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass(slots=True)
class ResponsesDelivered(Delivered):
    """The client's stream so far: the response object it was sent, its last sequence number, its open item."""

    response: dict[str, Any] = field(default_factory=dict)
    seq: int = -1
    items: int = 0  # output items the client saw added
    item_id: str | None = None  # the message item the continuation extends (None: no item yet)
    output_index: int = 0
    content_index: int = 0
    part_added: bool = False  # the client saw that item's content part added


def delivered(events: Sequence[bytes]) -> ResponsesDelivered:
    """Parse the relayed Responses events."""
    out = ResponsesDelivered()
    parts: list[str] = []
    for name, doc in named_docs(events):
        seq = int_at(doc, "sequence_number")
        if seq is not None:
            out.seq = max(out.seq, seq)
        if name == b"response.created":
            response = doc.get("response")
            if isinstance(response, dict):
                out.response = response
                out.id = response.get("id") if isinstance(response.get("id"), str) else None
                created = response.get("created_at")
                out.created = created if isinstance(created, int) else None
        elif name == b"response.output_item.added":
            item = member(doc, "item")
            out.items += 1
            kind = item.get("type")
            if kind == "reasoning":
                out.unfaithful = out.unfaithful or "reasoning"
            elif kind != "message":
                out.tool_call = True  # a function call (or another tool's item) half-streamed
            elif out.item_id is not None:
                out.unfaithful = out.unfaithful or "items"
            else:
                out.item_id = item.get("id") if isinstance(item.get("id"), str) else None
                index = doc.get("output_index")
                out.output_index = index if isinstance(index, int) else 0
        elif name == b"response.content_part.added":
            index = doc.get("content_index")
            out.content_index = index if isinstance(index, int) else 0
            out.part_added = True
            if out.content_index:
                out.unfaithful = out.unfaithful or "items"
        elif name == b"response.output_text.delta":
            delta = doc.get("delta")
            if isinstance(delta, str) and delta:
                parts.append(delta)
                out.chunks += 1
        elif name in (b"response.output_text.done", b"response.output_item.done") or name.decode() in _FINAL:
            out.finished = True
    out.text = "".join(parts)
    return out


def not_migratable(body: Mapping[str, Any], got: Delivered) -> str | None:
    """Why this Responses stream cannot continue faithfully elsewhere, or None."""
    include = body.get("include")
    if body.get("top_logprobs") or (isinstance(include, list) and _LOGPROBS_INCLUDE in include):
        return "logprobs"
    if body.get("previous_response_id") is not None:
        return "pinned"
    return got.blocker()


def continuation(body: Mapping[str, Any], got: ResponsesDelivered, sent_tokens: int) -> dict[str, Any]:
    """The original request with the delivered text as a partial assistant message, the output cap lowered."""
    value = body.get("input")
    items: list[Any] = [{"role": "user", "content": value}] if isinstance(value, str) else list(value or [])
    if got.text:
        items.append({
            "id": got.item_id or "msg_partial", "type": "message", "role": "assistant", "status": "in_progress",
            "content": [{"type": "output_text", "text": got.resume_text(), "annotations": []}],
        })  # fmt: skip
    return {**body, "input": items, **lowered_caps(body, ("max_output_tokens",), sent_tokens)}


class ResponsesSplice:
    """Rewrites a continuation's Responses events into the client's response, item and sequence numbering."""

    def __init__(self, got: ResponsesDelivered, sent_tokens: int) -> None:
        self._got = got
        self._sent = sent_tokens
        self._seq = got.seq + 1
        self._ids: dict[str, str] = {}  # continuation item id -> the client's
        self._indexes: dict[int, int] = {}  # continuation output_index -> the client's
        self._next_index = got.items
        self._extends: str | None = None  # the continuation's id of the item that extends the client's
        self._held = HeldBack(got.held_back())

    def rewrite(self, event: bytes) -> list[bytes]:
        """The client's events for one continuation event."""
        name, data = event_parts(event)
        doc = event_doc(data) if data else None
        if doc is None or not name:
            return [event] if data or name else []
        kind = name.decode()
        if kind in _HEAD:
            return []
        if kind == "response.output_item.added" and self._map_item(doc):
            return []  # the client has this item: it only grows
        extended = self._extends is not None and doc.get("item_id") == self._extends
        if kind == "response.content_part.added" and extended and self._got.part_added:
            return []
        self._remap(doc)
        if doc.get("item_id") is not None and doc.get("item_id") == self._got.item_id:
            if kind == "response.output_text.delta" and isinstance(doc.get("delta"), str):
                doc["delta"] = self._held.text(doc["delta"])
                if not doc["delta"]:
                    return []  # all of it was text the client has
            self._prefix_done(kind, doc)
        if kind == "response.output_item.done" and isinstance(doc.get("item"), dict):
            doc["item"] = self._item(doc["item"])
        if kind in _FINAL and isinstance(doc.get("response"), dict):
            doc["response"] = self._response(doc["response"])
        doc["sequence_number"] = self._seq
        self._seq += 1
        return [named_event(kind, doc)]

    def _map_item(self, doc: dict[str, Any]) -> bool:
        """Map an added item to the client's; True when the client already has it (the event is dropped)."""
        item = member(doc, "item")
        index = doc.get("output_index")
        cid = item.get("id")
        if self._got.item_id is not None and self._extends is None and item.get("type") == "message":
            self._extends = cid if isinstance(cid, str) else None
            if isinstance(cid, str):
                self._ids[cid] = self._got.item_id
            if isinstance(index, int):
                self._indexes[index] = self._got.output_index
            return True
        if isinstance(index, int) and index not in self._indexes:
            self._indexes[index] = self._next_index
            self._next_index += 1
        return False

    def _remap(self, doc: dict[str, Any]) -> None:
        item_id = doc.get("item_id")
        if isinstance(item_id, str) and item_id in self._ids:
            doc["item_id"] = self._ids[item_id]
        index = doc.get("output_index")
        if isinstance(index, int) and index in self._indexes:
            doc["output_index"] = self._indexes[index]

    def _prefix_done(self, kind: str, doc: dict[str, Any]) -> None:
        # The done events of the extended part state its whole text: what the client had, then the rest.
        if kind == "response.output_text.done" and isinstance(doc.get("text"), str):
            doc["text"] = self._whole(doc["text"])
        elif kind == "response.content_part.done" and isinstance(doc.get("part"), dict):
            doc["part"] = self._part(doc["part"])

    def _part(self, part: dict[str, Any]) -> dict[str, Any]:
        if part.get("type") == "output_text" and isinstance(part.get("text"), str):
            return {**part, "text": self._whole(part["text"])}
        return part

    def _whole(self, continued: str) -> str:
        """The extended part's whole text: what the client had, then what the continuation added to it."""
        return self._got.text + after_held(self._got.held_back(), continued)

    def _item(self, item: dict[str, Any]) -> dict[str, Any]:
        cid = item.get("id")
        if not isinstance(cid, str) or cid not in self._ids:
            return item
        content = item.get("content")
        if cid == self._extends and isinstance(content, list) and content and isinstance(content[0], dict):
            content = [self._part(content[0]), *content[1:]]
        return {**item, "id": self._ids[cid], "content": content}

    def _response(self, response: dict[str, Any]) -> dict[str, Any]:
        """The final response object: the client's id and request echo, every output item, usage summed."""
        orig = self._got.response
        out = {**response}
        for key in ("id", "created_at", "max_output_tokens"):
            if key in orig:
                out[key] = orig[key]
        output = response.get("output")
        if isinstance(output, list):
            out["output"] = [self._item(i) if isinstance(i, dict) else i for i in output]
            if self._got.item_id is not None and self._extends is None:
                # The continuation added no text to the client's item: it still belongs in the output, whole.
                out["output"].insert(0, _message(self._got.item_id, self._got.text))
        usage = response.get("usage")
        if isinstance(usage, dict):
            out["usage"] = summed_usage(usage, self._sent)
        return out


def _message(item_id: str, text: str) -> dict[str, Any]:
    return {"id": item_id, "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
            "role": "assistant", "status": "completed", "type": "message"}  # fmt: skip


def summed_usage(usage: dict[str, Any], sent_tokens: int) -> dict[str, Any]:
    """The continuation's usage with the delivered tokens moved from input (its prompt held them) to output."""
    inp, out = usage.get("input_tokens"), usage.get("output_tokens")
    if not isinstance(inp, int) or not isinstance(out, int):
        return usage
    summed = {**usage, "input_tokens": max(inp - sent_tokens, 0), "output_tokens": out + sent_tokens}
    summed["total_tokens"] = summed["input_tokens"] + summed["output_tokens"]
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        summed["input_tokens_details"] = {**details,
                                          "cached_tokens": min(details["cached_tokens"], summed["input_tokens"])}
    return summed


def resend(ctx: Exchange, got: Delivered, sent_tokens: int, served: str, priority: int | None) -> Resend:
    """The original request plus the partial message item, to the same path."""
    assert isinstance(got, ResponsesDelivered)
    return same_endpoint(ctx, continuation(ctx.body, got, sent_tokens), served, priority)


def splice(got: Delivered, sent_tokens: int) -> ResponsesSplice:
    """A splice into the client's response."""
    assert isinstance(got, ResponsesDelivered)
    return ResponsesSplice(got, sent_tokens)


# Responses continue on /v1/responses: vLLM takes the partial assistant message as the turn to continue.
RESPONSES_MIGRATION = Migration(delivered, not_migratable, resend, splice)
