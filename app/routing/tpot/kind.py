"""What a request asks the model to write, for acceptance per kind (pure; reads no more than the last turn).

An ngram or draft proposer is accepted when the output repeats what the context holds: a code edit returns most of
the code it was given, tool-call arguments quote the conversation; free prose rarely repeats. Three kinds:

  tool   the request offers tools the model may call (tool_choice is not "none")
  code   the last user turn carries a code fence or a diff
  prose  anything else

Only the last turn's text is searched (a substring test, ~1 µs for a few KB); nothing is kept but the label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

Kind = Literal["code", "tool", "prose"]
KINDS: tuple[Kind, ...] = ("code", "tool", "prose")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts (OpenAI, Anthropic): their text pieces
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _last_user_text(body: Mapping[str, Any]) -> str:
    turns = body.get("messages")
    if turns is None:
        turns = body.get("input")  # the Responses API
        if isinstance(turns, str):
            return turns
    if not isinstance(turns, list):
        prompt = body.get("prompt")  # completions
        return prompt if isinstance(prompt, str) else ""
    for turn in reversed(turns):
        if isinstance(turn, dict) and turn.get("role", "user") == "user":
            return _text(turn.get("content"))
    return ""


def request_kind(body: Mapping[str, Any]) -> Kind:
    """The request's kind (see the module docstring)."""
    if body.get("tools") and body.get("tool_choice") != "none":
        return "tool"
    text = _last_user_text(body)
    # a fence, or a unified diff's hunk or file header (spelled out: a generator over markers costs 2x)
    if "```" in text or "\n@@ " in text or "\n+++ " in text or "\n--- a/" in text:
        return "code"
    return "prose"
