"""Where moved lines are restated: a trailing system message, or a delimited block in the last user turn."""

from __future__ import annotations

from typing import Any, Literal

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
