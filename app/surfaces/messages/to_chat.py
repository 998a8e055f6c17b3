"""A Messages request as the chat completion request vLLM 0.32 turns it into (AnthropicServingMessages).

vLLM's Messages endpoint has no way to continue a partial assistant turn (it always adds a generation
prompt), so a cut Messages stream continues through /v1/chat/completions: this is vLLM's own conversion
(to_chat_completion_request: system, content blocks, tools, tool_choice, sampling fields) so the
continuation sees the prompt the original replica rendered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.surfaces.messages.wire import BILLING_HEADER

# Messages fields vLLM copies onto the chat request under the same name.
_SAME_NAME = ("temperature", "top_p", "top_k", "cache_salt", "chat_template_kwargs", "ignore_eos", "seed",
              "kv_transfer_params", "vllm_xargs")  # fmt: skip
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def _image_url(source: Any) -> str:
    if not isinstance(source, dict):
        return ""
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"
    return str(source.get("url", ""))


def _system_text(system: Any) -> str | None:
    """The system prompt's text, without the blocks vLLM drops (Claude Code's per-request billing line)."""
    if isinstance(system, str):
        return system or None
    if not isinstance(system, list):
        return None
    parts = [b["text"] for b in system if isinstance(b, dict) and b.get("type") == "text"
             and isinstance(b.get("text"), str) and b["text"] and not b["text"].startswith(BILLING_HEADER)]  # fmt: skip
    return "".join(parts) or None


def _schema(schema: Any) -> Any:
    """AnthropicTool's input_schema as vLLM validates it: `type` defaults to object (added last)."""
    return {**schema, "type": schema.get("type", "object")} if isinstance(schema, dict) else schema


def _tool_result(block: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
    content = block.get("content")
    images: list[str] = []
    if isinstance(content, list):
        texts = [i.get("text", "") for i in content if isinstance(i, dict) and i.get("type") == "text"]
        images = [_image_url(i.get("source")) for i in content if isinstance(i, dict) and i.get("type") == "image"]
        content = "\n".join(texts)
    out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": content or ""})
    if any(images):
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images if u]})


def _message(msg: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
    role, content = msg.get("role"), msg.get("content")
    if role == "system":
        # vLLM's _extract_system_text: a system turn inside `messages` stays where it is, as its text without
        # the billing blocks, and is left out when nothing remains. (With a template that wants system first,
        # vLLM's Messages endpoint merges it into the leading one instead; the chat continuation cannot know
        # that and renders it in place, which such a template refuses: the continuation then fails as one.)
        text = _system_text(content)
        if text and not text.startswith(BILLING_HEADER):
            out.append({"role": "system", "content": text})
        return
    chat: dict[str, Any] = {"role": role}
    if isinstance(content, str):
        chat["content"] = content
    elif isinstance(content, list):
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and block.get("text"):
                parts.append({"type": "text", "text": block["text"]})
            elif kind == "image" and block.get("source"):
                parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
            elif kind == "tool_use":
                calls.append({"id": block.get("id") or "call_0", "type": "function",
                              "function": {"name": block.get("name") or "",
                                           "arguments": json.dumps(block.get("input") or {})}})  # fmt: skip
            elif kind == "tool_result" and role == "user":
                _tool_result(block, out)
            elif kind == "tool_result":
                parts.append({"type": "text", "text": f"Tool result: {block.get('content') or ''}"})
        if reasoning:
            chat["reasoning"] = "".join(reasoning)
        if calls:
            chat["tool_calls"] = calls
        if parts:
            chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    if not (role == "user" and "content" not in chat):
        out.append(chat)


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The system prompt, then every message, as chat messages."""
    out: list[dict[str, Any]] = []
    system = _system_text(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    for msg in body.get("messages") or ():
        if isinstance(msg, dict):
            _message(msg, out)
    return out


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completion request for a Messages body (streamed, with its usage chunk)."""
    chat: dict[str, Any] = {"model": body.get("model"), "messages": chat_messages(body),
                            "max_tokens": body.get("max_tokens"), "stream": True,
                            "stream_options": {"include_usage": True}}  # fmt: skip
    for key in _SAME_NAME:
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    config = body.get("output_config")
    if isinstance(config, dict):
        fmt = config.get("format")
        if isinstance(fmt, dict) and fmt.get("json_schema"):
            schema = {"name": fmt.get("type"), "schema": fmt["json_schema"]}
            chat["response_format"] = {"type": fmt.get("type"), "json_schema": schema}
        if config.get("effort") is not None:
            chat["reasoning_effort"] = config["effort"]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        chat["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use", False)
        if choice.get("type") == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        else:
            chat["tool_choice"] = _TOOL_CHOICE.get(str(choice.get("type")), "auto")
    tools = body.get("tools")
    if isinstance(tools, list):
        chat["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description"), "parameters": _schema(t.get("input_schema")),
            "strict": t.get("strict"), "defer_loading": t.get("defer_loading"),
        }} for t in tools if isinstance(t, dict)]  # fmt: skip
        chat.setdefault("tool_choice", "auto")
    return chat
