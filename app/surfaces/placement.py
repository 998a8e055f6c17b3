"""Where moved spans go: per-request lines to a tail block (a trailing system message, or a delimited block in the
last user turn); per-session sections to the head of the first user turn."""

from __future__ import annotations

from typing import Any, Literal

from app.prompt import Path, get_path, with_text

BLOCK_OPEN = "<request_metadata>"
BLOCK_CLOSE = "</request_metadata>"
TailPlacement = Literal["system", "user"]


def render_block(lines: list[str]) -> str:
    """The restated lines, verbatim, inside one delimited block (also how a second pass recognises them)."""
    return BLOCK_OPEN + "\n" + "\n".join(lines) + "\n" + BLOCK_CLOSE


def is_restated(content: Any) -> bool:
    """Whether a message's content is a block this stage appended (never scanned again)."""
    return isinstance(content, str) and content.startswith(BLOCK_OPEN + "\n")


def last_user_index(messages: list[Any]) -> int | None:
    """Index of the last user message whose content can take an appended text block."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if isinstance(msg, dict) and msg.get("role") == "user" and isinstance(msg.get("content"), str | list):
            return i
    return None


def place_in_chat(messages: list[Any], lines: list[str], placement: TailPlacement) -> list[Any]:
    """A new message list with `lines` restated at the tail (the input list is not modified)."""
    block = render_block(lines)
    if placement == "system":
        tail = {"role": "system", "content": block}
        last = messages[-1] if messages else None
        if isinstance(last, dict) and last.get("role") == "assistant":
            # An assistant prefill (continue_final_message) must stay last: the block goes before it.
            return [*messages[:-1], tail, last]
        return [*messages, tail]
    idx = last_user_index(messages)
    if idx is None:
        raise ValueError("no user message to carry the restated block")
    msg = messages[idx]
    content = msg["content"]
    if isinstance(content, str):
        new_content: Any = content + "\n\n" + block
    else:
        new_content = [*content, {"type": "text", "text": block}]
    out = list(messages)
    out[idx] = {**msg, "content": new_content}
    return out


def place_in_prompt(prompt: str, lines: list[str]) -> str:
    """`prompt` with the block inserted before its last non-empty line (the completion cue stays last)."""
    block = render_block(lines)
    body = prompt.rstrip("\n")
    cut = body.rfind("\n") + 1
    if cut == 0:
        return prompt + ("" if prompt.endswith("\n") or not prompt else "\n") + block
    return prompt[:cut] + block + "\n" + prompt[cut:]


def at_head(body: dict[str, Any], content_path: Path, text: str, part_type: str,
            lead: tuple[int, ...] = ()) -> dict[str, Any]:
    """A copy of `body` whose content at `content_path` (the first user turn) starts with `text`: a part of its
    own in a content list, after the parts at the indices `lead` (reminders every session shares, in that order;
    the other parts follow in theirs), or a leading paragraph of a string. The rest of the body is shared."""
    content = get_path(body, content_path)
    if isinstance(content, str):
        return with_text(body, content_path, text + "\n\n" + content if content else text)
    parts = content if isinstance(content, list) else []
    head = {"type": part_type, "text": text}
    if not lead:
        return with_text(body, content_path, [head, *parts])
    rest = [p for i, p in enumerate(parts) if i not in lead]
    return with_text(body, content_path, [*(parts[i] for i in lead), head, *rest])
