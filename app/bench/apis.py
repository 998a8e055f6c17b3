"""The three APIs bench can speak: the chat body a workload builds, re-shaped per API, and each API's replies read.

Workloads build chat-completions bodies; `to_body` turns one into a Responses or Messages request carrying the
same prompt (system -> instructions / system, turns -> input items / messages, tools re-shaped), so the three APIs
send the same tokens. Usage comes from each API's own fields: chat `prompt_tokens_details.cached_tokens`,
Responses `input_tokens_details.cached_tokens`, Messages `cache_read_input_tokens` (its `input_tokens` excludes
what the cache read or wrote, so the prompt is their sum). A stream's first token is its first text delta event.
"""

from __future__ import annotations

from typing import Any, Literal

from app.bench.spec import RequestRecord

ApiName = Literal["chat", "responses", "messages"]
API_NAMES: tuple[ApiName, ...] = ("chat", "responses", "messages")
PATHS: dict[str, str] = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}

# Chat fields each conversion replaces; everything else (extra_body: ignore_eos, seed, …) passes through.
_CHAT_ONLY = frozenset(
    {"messages", "max_tokens", "max_completion_tokens", "stream_options", "tools", "tool_choice", "model", "stream"}
)
_MESSAGES_TOOL_CHOICE = {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"}}

# (text or None when the event carries no token, done, error message or None)
StreamStep = tuple[str | None, bool, str | None]
_NOTHING: StreamStep = (None, False, None)


def _split(chat: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    system = [str(m.get("content") or "") for m in chat.get("messages", []) if m.get("role") == "system"]
    turns = [{"role": m["role"], "content": m.get("content") or ""} for m in chat.get("messages", [])
             if m.get("role") != "system"]
    return ("\n".join(system) if system else None), turns


def _functions(chat: dict[str, Any]) -> list[dict[str, Any]]:
    return [t.get("function", t) for t in chat.get("tools") or [] if isinstance(t, dict)]


def to_body(api: str, chat: dict[str, Any]) -> dict[str, Any]:
    """The request body for `api` carrying the prompt of chat-completions body `chat`."""
    if api == "chat":
        return chat
    system, turns = _split(chat)
    rest = {k: v for k, v in chat.items() if k not in _CHAT_ONLY}
    max_tokens = chat.get("max_completion_tokens") or chat.get("max_tokens")
    body: dict[str, Any] = {"model": chat.get("model"), "stream": bool(chat.get("stream"))}
    if api == "responses":
        body["input"] = turns
        if system is not None:
            body["instructions"] = system
        if max_tokens is not None:
            body["max_output_tokens"] = max_tokens
        if "tools" in chat:
            body["tools"] = [{"type": "function", "name": f.get("name"), "description": f.get("description"),
                              "parameters": f.get("parameters")} for f in _functions(chat)]
        if "tool_choice" in chat:
            body["tool_choice"] = chat["tool_choice"]
        return {**body, **rest}
    if api == "messages":
        body["messages"] = turns
        if system is not None:
            body["system"] = system
        body["max_tokens"] = max_tokens or 256  # required by Messages
        if "tools" in chat:
            body["tools"] = [
                {"name": f.get("name"), "description": f.get("description"),
                 "input_schema": f.get("parameters") or {"type": "object"}}
                for f in _functions(chat)
            ]
        if isinstance(chat.get("tool_choice"), str) and chat["tool_choice"] in _MESSAGES_TOOL_CHOICE:
            body["tool_choice"] = _MESSAGES_TOOL_CHOICE[chat["tool_choice"]]
        return {**body, **rest}
    raise ValueError(f"unknown api {api!r}; expected one of {', '.join(API_NAMES)}")


# ------------------------------------------------------------------------------------------------ usage
def apply_usage(api: str, rec: RequestRecord, usage: dict[str, Any]) -> None:
    """Fill prompt/cached/output tokens of `rec` from one API's usage object."""
    rec.usage_reported = True
    if api == "chat":
        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        rec.output_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        rec.cached_tokens = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    elif api == "responses":
        rec.prompt_tokens = int(usage.get("input_tokens") or 0)
        rec.output_tokens = int(usage.get("output_tokens") or 0)
        details = usage.get("input_tokens_details")
        rec.cached_tokens = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    else:
        read = int(usage.get("cache_read_input_tokens") or 0)
        written = int(usage.get("cache_creation_input_tokens") or 0)
        rec.prompt_tokens = int(usage.get("input_tokens") or 0) + read + written
        rec.output_tokens = int(usage.get("output_tokens") or 0)
        rec.cached_tokens = read


# ------------------------------------------------------------------------------------------ whole bodies
def whole_text(api: str, data: dict[str, Any], rec: RequestRecord) -> str:
    """The reply text of a non-streamed answer; its usage goes into `rec`."""
    if isinstance(data.get("usage"), dict):
        apply_usage(api, rec, data["usage"])
    if api == "chat":
        choices = data.get("choices") or []
        return str((choices[0].get("message") or {}).get("content") or "") if choices else ""
    if api == "responses":
        return "".join(
            str(part.get("text") or "")
            for item in data.get("output") or []
            if isinstance(item, dict) and item.get("type") == "message"
            for part in item.get("content") or []
            if isinstance(part, dict) and part.get("type") == "output_text"
        )
    return "".join(str(b.get("text") or "") for b in data.get("content") or [] if b.get("type") == "text")


# ------------------------------------------------------------------------------------------ stream events
def chat_delta(choice: dict[str, Any]) -> str | None:
    """Text a streamed chat choice carries, or None when it carries no token (role-only or finish chunks)."""
    delta = choice.get("delta")
    if not delta:
        return None
    text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    if text:
        return str(text)
    return "" if delta.get("tool_calls") else None


def _chat_event(event: dict[str, Any], rec: RequestRecord) -> StreamStep:
    if "error" in event and not event.get("choices"):
        err = event["error"]
        return None, False, str(err.get("message") if isinstance(err, dict) else err)[:200]
    if isinstance(event.get("usage"), dict):
        apply_usage("chat", rec, event["usage"])
    texts = [t for c in event.get("choices") or () if (t := chat_delta(c)) is not None]
    return ("".join(texts) if texts else None), False, None


def _responses_event(event: dict[str, Any], rec: RequestRecord) -> StreamStep:
    kind = event.get("type")
    if kind in ("response.output_text.delta", "response.reasoning_text.delta"):
        return str(event.get("delta") or ""), False, None
    if kind == "response.function_call_arguments.delta":
        return "", False, None
    if kind in ("response.completed", "response.incomplete"):
        usage = (event.get("response") or {}).get("usage")
        if isinstance(usage, dict):
            apply_usage("responses", rec, usage)
        return None, True, None
    if kind in ("response.failed", "error"):
        err = (event.get("response") or {}).get("error") if kind == "response.failed" else event
        return None, False, str((err or {}).get("message") or kind)[:200]
    return _NOTHING


def _messages_event(event: dict[str, Any], rec: RequestRecord) -> StreamStep:
    kind = event.get("type")
    if kind == "content_block_delta":
        delta = event.get("delta") or {}
        text = delta.get("text") if delta.get("type") == "text_delta" else delta.get("thinking")
        return str(text or ""), False, None
    if kind == "message_start":
        usage = (event.get("message") or {}).get("usage")
        if isinstance(usage, dict):
            apply_usage("messages", rec, usage)
        return _NOTHING
    if kind == "message_delta":
        if isinstance(event.get("usage"), dict):  # the final counts (vLLM: with the cache split)
            apply_usage("messages", rec, event["usage"])
        return _NOTHING
    if kind == "message_stop":
        return None, True, None
    if kind == "error":
        return None, False, str((event.get("error") or {}).get("message") or "error")[:200]
    return _NOTHING


STREAM_READERS = {"chat": _chat_event, "responses": _responses_event, "messages": _messages_event}
