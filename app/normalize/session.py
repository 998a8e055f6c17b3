"""Which session a request belongs to: the id the client sends, else the first user turn.

Normalization needs it to tell a span that changes per request from one that changes per session, and to keep a
session's layout fixed across its turns. The ids clients send (`prompt_cache_key`, `X-Claude-Code-Session-Id`,
Codex's `session-id`, opencode's `x-session-id`, Claude Code's `metadata.user_id`) are read by the routing's
session key (app/routing/session_key.py). Its history fallback hashes the system text too, which a per-request
value in it would change on every request (each would look like a new session, and the value per session);
here the fallback is the first user turn alone, which every turn of an agent session repeats.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.prompt import PromptView
from app.routing.session_key import session_key as client_session


def session_key(headers: Mapping[str, str] | None, body: Mapping[str, Any], view: PromptView) -> int:
    """A hash naming the request's session (the same on every turn of it)."""
    named = client_session(headers or {}, body, view, "", history=False)
    if named is not None:
        return named.key
    first = view.first_user
    if first is None:
        return hash(("u", ()))
    n = len(first)
    return hash(("u", tuple([s.text for s in view.head if s.path[:n] == first])))  # a list: no generator frame
