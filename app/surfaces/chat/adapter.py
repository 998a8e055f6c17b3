"""POST /v1/chat/completions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from app.errors import bad_request
from app.prefix_key import HEAD_CHARS
from app.prompt import HeadBuilder, PromptView, TextSlot, content_chars, text_of, text_slots
from app.records import Operation
from app.surfaces.base import WarmRequest, leading_then_user, positive_int, warm_within
from app.surfaces.chat.migration import CHAT_MIGRATION
from app.surfaces.migration import Migration
from app.surfaces.openai import OpenAISurface, media_free_parts
from app.surfaces.placement import TailPlacement, is_restated, last_user_index, place_in_chat

# Role and framing tokens the template adds per message.
TOKENS_PER_MESSAGE = 4
_LEADING_ROLES = frozenset({"system", "developer"})
# Fields that reach the chat template, so a pre-warm renders to the same leading tokens.
RENDER_FIELDS = ("tools", "tool_choice", "chat_template", "chat_template_kwargs", "documents")


class ChatSurface(OpenAISurface):
    """OpenAI chat completions: `messages`, `tools`, stream chunks with `delta`."""

    name = "chat_completions"
    operation: Operation = "chat"
    has_tools = True
    template_kwargs = True
    migration: Migration | None = CHAT_MIGRATION
    hashes_blocks = True

    def validate_fields(self, body: dict[str, Any]) -> None:
        """`messages` is a non-empty list of objects with a role; `tools` a list."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty array", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad_request(f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise bad_request("'tools' must be an array", param="tools")
        positive_int(body, "max_completion_tokens")

    def view(self, body: Mapping[str, Any]) -> PromptView:
        """One pass over `messages`: head texts, key head, character count, framing."""
        messages = body.get("messages")
        if not isinstance(messages, list):
            messages = []
        head: list[TextSlot] = []
        key = HeadBuilder(HEAD_CHARS)
        chars = framing = 0
        first_user: int | None = None
        first_other: Any = None
        leading = True  # still in the leading system/developer messages
        keying = True  # still in the messages the key reads (leading system ones)
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                leading = False
                continue
            content = msg.get("content")
            framing += TOKENS_PER_MESSAGE
            chars += content_chars(content)
            if msg.get("tool_calls"):
                chars += len(orjson.dumps(msg["tool_calls"]))
            role = msg.get("role")
            if not isinstance(role, str):
                role = ""
            if keying:
                if role in _LEADING_ROLES:
                    key.add(text_of(content))
                else:
                    keying = False
                    first_other = msg
            if leading and role in _LEADING_ROLES:
                if not is_restated(content):
                    head.extend(text_slots(i, content, ("messages", i, "content")))
                continue
            leading = False
            if role == "user" and first_user is None:
                first_user = i
                head.extend(text_slots(i, content, ("messages", i, "content")))
        tools_json = orjson.dumps(body["tools"]) if body.get("tools") else b""
        functions = body.get("functions")
        tool_chars = len(tools_json) + (len(orjson.dumps(functions)) if functions else 0)
        if tools_json:
            key.add_serialized(tools_json)
        if first_other is not None:
            key.add(text_of(first_other.get("content")))
        last_user = last_user_index(messages)
        refs: tuple[str, ...] = ()
        if last_user is not None and last_user != first_user:
            refs = tuple(s.text for s in text_slots(last_user, messages[last_user].get("content"), ()))
        return PromptView(
            head=tuple(head), tail_refs=refs, key_head=key.text(), text_chars=chars,
            framing_tokens=framing, tool_chars=tool_chars, restatable=last_user is not None,
        )  # fmt: skip

    def warm_request(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """The leading system/developer messages, the first user message and what the template reads, one token."""
        head = leading_then_user(body.get("messages"), _LEADING_ROLES)
        if head is None:
            return None
        out: dict[str, Any] = {"messages": head, "max_tokens": 1, "stream": False}
        chars = sum(content_chars(m.get("content")) for m in head)
        return warm_within("/v1/chat/completions", body, out, RENDER_FIELDS, chars, max_chars)

    def warm_history(self, body: Mapping[str, Any], max_chars: int) -> WarmRequest | None:
        """Every message so far (the earlier turns, tool calls and results, the newest turn), as warm_request."""
        messages = body.get("messages")
        if not isinstance(messages, list) or leading_then_user(messages, _LEADING_ROLES) is None:
            return None  # no stable prefix: nothing the memory tracks
        chars = 0
        for m in messages:
            if not isinstance(m, dict):
                continue
            chars += content_chars(m.get("content"))
            if m.get("tool_calls"):
                chars += len(orjson.dumps(m["tool_calls"]))
        out: dict[str, Any] = {"messages": list(messages), "max_tokens": 1, "stream": False}
        return warm_within("/v1/chat/completions", body, out, RENDER_FIELDS, chars, max_chars)

    def place_tail(self, body: dict[str, Any], lines: list[str], placement: TailPlacement) -> dict[str, Any]:
        """A trailing system message, or a block appended to the last user turn."""
        return {**body, "messages": place_in_chat(list(body["messages"]), lines, placement)}

    def input_messages(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Role and parts per message; tool calls and results by id, name and arguments."""
        out: list[dict[str, Any]] = []
        for msg in body.get("messages") or ():
            if not isinstance(msg, dict):
                continue
            role = str(msg.get("role", "user"))
            if role == "tool":
                parts: list[dict[str, Any]] = [
                    {"type": "tool_call_response", "id": msg.get("tool_call_id"), "response": msg.get("content")}
                ]
            else:
                parts = media_free_parts(msg.get("content"))
            for call in msg.get("tool_calls") or ():
                if isinstance(call, dict):
                    fn = call.get("function") or {}
                    parts.append(
                        {"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                         "arguments": fn.get("arguments")}
                    )  # fmt: skip
            out.append({"role": role, "parts": parts})
        return out

