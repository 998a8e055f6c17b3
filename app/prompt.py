"""The typed view of a request's prompt that every stage reads, built once by the request's API surface.

Limits (token estimate), normalize (where volatile text may be and where it may go), the routing key and
spans all read this instead of walking the body with rules of their own. The surfaces (app/surfaces/)
build it; after normalize rewrites a body, the surface builds it again from the new body.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class TextSlot:
    """One text of the prompt head where volatile lines may be found, and where it lives in the body."""

    path: Path  # keys and indices from the body's root to the string
    text: str
    turn: int  # which turn (message, input item, or -1 for a top-level field) it belongs to
    part: int  # which part of that turn's content, -1 when the content is a plain string


@dataclass(frozen=True, slots=True)
class PromptView:
    """What the stages need of a prompt; never holds more than references into the body."""

    head: tuple[TextSlot, ...] = ()  # leading system/instruction texts and the first user turn
    tail_refs: tuple[str, ...] = ()  # texts of the last user turn, when it is not the first (positional refs)
    key_head: str | bytes = ""  # the leading content the routing key hashes (str: chunk-aligned later)
    text_chars: int = 0  # characters of all prompt text, for the token estimate
    framing_tokens: int = 0  # per-turn framing the estimate adds (role markers)
    tool_chars: int = 0  # characters of the serialized tool specs
    restatable: bool = True  # a tail block can be placed (a user turn exists when placement needs one)
    first_user: Path | None = None  # the first user turn's content (a string, or a list of parts)
    part_type: str = "text"  # the type of a text part in this API's content lists


_LEADING_TAG_RX = re.compile(r"\s*<(?P<tag>[A-Za-z][\w.\-]{0,40})(?:[ \t][^<>\n]{0,200})?>")
# Longer, a tagged part is content (a pasted file), not a reminder: and what is done with a reminder (a search for
# dates and ids, ~250 ns a character) stays bounded per part whatever a caller sends.
MAX_REMINDER_CHARS = 16_384


def block_tag(text: str) -> str | None:
    """The tag of `text` when it is one whole tagged block of at most `MAX_REMINDER_CHARS` (`<system-reminder>…
    </system-reminder>`: what coding clients wrap around the user's words in a turn's parts), else None."""
    if len(text) > MAX_REMINDER_CHARS:
        return None
    m = _LEADING_TAG_RX.match(text)
    if m is None:
        return None
    tag = m.group("tag")
    return tag if text.rstrip().endswith("</" + tag + ">") else None


def text_of(content: Any) -> str:
    """A turn's text: a string, or the text parts of a content list joined (media does not count)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def text_slots(turn: int, content: Any, path: Path, text_types: Sequence[str] = ("text",)) -> list[TextSlot]:
    """The text slots of one turn's content (a string, or a list of typed parts)."""
    if isinstance(content, str):
        return [TextSlot(path, content, turn, -1)]
    if isinstance(content, list):
        return [
            TextSlot((*path, j, "text"), part["text"], turn, j)
            for j, part in enumerate(content)
            if isinstance(part, dict) and part.get("type") in text_types and isinstance(part.get("text"), str)
        ]
    return []


def with_text(body: dict[str, Any], path: Path, text: str | list[Any]) -> dict[str, Any]:
    """A copy of `body` with the string at `path` replaced; everything off the path is shared, not copied."""
    out: dict[str, Any] = _replace(body, path, text)
    return out


def get_path(body: Any, path: Path) -> Any:
    """The value at `path` in `body` (None when the path leads nowhere)."""
    node = body
    for step in path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _replace(node: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {**node, head: _replace(node[head], rest, value)}
    copy = list(node)
    copy[head] = _replace(node[head], rest, value)  # type: ignore[index]
    return copy


def content_chars(content: Any) -> int:
    """Characters of text in a content value (strings, text parts, token ids at ~4 characters each)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += len(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
            elif isinstance(part, int):  # a pre-tokenized prompt: one token each
                total += CHARS_PER_TOKEN
            elif isinstance(part, list):
                total += content_chars(part)
        return total
    return 0


CHARS_PER_TOKEN = 4


class HeadBuilder:
    """Collects the routing key's leading content up to `limit` characters (parts joined by a separator)."""

    __slots__ = ("full", "limit", "parts", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.full = False

    def add(self, text: str) -> None:
        """Append one part (cut at the limit)."""
        if self.full:
            return
        piece = text[: self.limit - self.size]
        self.parts.append(piece)
        self.size += len(piece) + 1
        self.full = self.size >= self.limit

    def add_serialized(self, raw: bytes) -> None:
        """Append serialized JSON (tool specs as sent: their key order reaches the tokens, so the key too)."""
        if not self.full:
            self.add(raw[: self.limit - self.size].decode("utf-8", "ignore"))

    def text(self) -> str:
        """The collected head."""
        return "\x1e".join(self.parts)
