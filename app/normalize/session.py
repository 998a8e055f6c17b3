"""Which session a request belongs to, from what agents send: their session headers and fields, or the history.

Normalization needs it to tell a span that changes per request from one that changes per session, and to keep a
session's layout fixed across its turns. Claude Code sends `X-Claude-Code-Session-Id` and `metadata.user_id`
(a JSON string with `session_id`), Codex `session-id` and `prompt_cache_key` (its session id); other clients
send nothing, and then the first user turn names the session: every turn of an agent session repeats it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from app.prompt import PromptView

SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "x-session-id")


def session_key(headers: Mapping[str, str] | None, body: Mapping[str, Any], view: PromptView) -> int:
    """A hash naming the request's session (the same on every turn of it)."""
    if headers:
        for name in SESSION_HEADERS:
            value = headers.get(name)
            if value:
                return hash(("h", value))
    cache_key = body.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:
        return hash(("k", cache_key))
    from_metadata = _metadata_session(body.get("metadata"))
    if from_metadata is not None:
        return hash(("m", from_metadata))
    first = view.first_user
    return hash(("u", tuple(s.text for s in view.head if first is not None and s.path[: len(first)] == first)))


def _metadata_session(metadata: Any) -> str | None:
    """Claude Code's `metadata.user_id`: a JSON object with `session_id` (older versions: `…_session_<id>`)."""
    if not isinstance(metadata, Mapping):
        return None
    user_id = metadata.get("user_id")
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            doc = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        sid = doc.get("session_id") if isinstance(doc, dict) else None
        return sid if isinstance(sid, str) and sid else None
    _, sep, sid = user_id.rpartition("_session_")
    return sid if sep and sid else None
