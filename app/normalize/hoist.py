"""System turns a client puts right after its first user message go before it, unless they vary between sessions.

Claude Code configured with a non-Claude model name sends `[user, system, …]`: the first user message (a date
reminder and the task) and then a `system` turn listing its agent types and skills (~6 KB, the same in every
session; `mid-conversation-system-2026-04-07`). The task differs per session, so everything after it — that
whole list — is computed again for every new session although every session sends it alike. Before the first
user message it joins the shared prefix (system, tools, list); every turn of a session repeats the same
`[user, system]` start, so the swap is the same on every turn and the session stays append-only. A system turn
seen to vary between sessions is left where the client put it (it would end the shared prefix earlier); the
first request of a session decides, like every head move (app/normalize/varying.py).
"""

from __future__ import annotations

from typing import Any

from app.normalize.varying import ACROSS, Variation
from app.surfaces.placement import is_restated


def system_turns_after(messages: Any, first_user: int) -> list[int]:
    """The indices of the `system` turns right after the first user message, up to a reply or this stage's own
    tail block (a trailing restated system message): what may go before it."""
    if not isinstance(messages, list):
        return []
    out: list[int] = []
    for i in range(first_user + 1, len(messages)):
        msg = messages[i]
        if not isinstance(msg, dict) or msg.get("role") != "system" or is_restated(msg.get("content")):
            break
        out.append(i)
    return out


def hoisted(
    messages: list[Any], first_user: int, turns: list[int], variation: Variation, session: int,
    plan: tuple[set[int], set[int]],
) -> list[int]:
    """Of `turns` (system_turns_after), the indices that go before the first user message.

    Learns each turn's variation between sessions under its position; the session's plan keeps the decision.
    """
    heads, decided = plan
    out: list[int] = []
    for i in turns:
        msg = messages[i]
        key = hash(("hoist", i - first_user))
        flags = variation.observe(key, hash(_content_key(msg.get("content"))), session)
        if key not in decided:
            decided.add(key)
            if not flags & ACROSS:
                heads.add(key)
        if key in heads:
            out.append(i)
    return out


def hoist(body: dict[str, Any], first_user: int, indices: list[int]) -> dict[str, Any]:
    """`body` with the messages at `indices` (all after `first_user`) moved right before it, in order."""
    messages: list[Any] = body["messages"]
    last = indices[-1]
    moved = set(indices)
    lead = [messages[i] for i in indices]
    rest = [messages[i] for i in range(first_user, last + 1) if i not in moved]
    return {**body, "messages": [*messages[:first_user], *lead, *rest, *messages[last + 1 :]]}


def _content_key(content: Any) -> Any:
    """A hashable form of a turn's content (its text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return tuple(p.get("text") if isinstance(p, dict) else None for p in content)
    return None
