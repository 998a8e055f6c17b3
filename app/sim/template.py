"""ChatML rendering, as SmolLM2's chat template does it, so message order maps to token order as in vLLM."""

from __future__ import annotations

from typing import Any

import orjson

# SmolLM2-Instruct's template inserts this system turn when the conversation does not start with one.
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class TemplateError(ValueError):
    """The messages cannot be rendered (vLLM answers 400)."""


def _content_text(content: Any) -> str:
    """Plain text of a message's content: a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise TemplateError("Only text content parts are supported by this model")
        return "\n".join(parts)
    raise TemplateError("message content must be a string or a list of parts")


def _dumps(value: Any) -> str:
    # Jinja's tojson keeps the client's key order, so the client's bytes reach the tokens; orjson does too.
    return orjson.dumps(value).decode()


def render_chat(
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    default_system: str | None = SMOLLM2_DEFAULT_SYSTEM,
    continue_final_message: bool = False,
) -> str:
    """The prompt text for `messages`: `<|im_start|>role\\ncontent<|im_end|>\\n` per turn, tools in the system turn.

    `continue_final_message` leaves the last turn open (vLLM cuts the rendered prompt after its content).
    """
    if not isinstance(messages, list) or not messages:
        raise TemplateError("messages must be a non-empty list")
    out: list[str] = []
    first_is_system = isinstance(messages[0], dict) and messages[0].get("role") == "system"
    tool_block = ""
    if tools:
        tool_block = (
            "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>\n"
            + "\n".join(_dumps(t.get("function", t) if isinstance(t, dict) else t) for t in tools)
            + "\n</tools>"
        )
    if not first_is_system and (default_system is not None or tool_block):
        out.append(f"<|im_start|>system\n{default_system or ''}{tool_block}<|im_end|>\n")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise TemplateError("each message must be an object with a role")
        role = str(msg["role"])
        text = _content_text(msg.get("content"))
        if i == 0 and first_is_system:
            text += tool_block
        for call in msg.get("tool_calls") or []:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            text += f"\n<tool_call>\n{_dumps({'name': fn.get('name'), 'arguments': fn.get('arguments')})}\n</tool_call>"
        last = continue_final_message and i == len(messages) - 1
        out.append(f"<|im_start|>{role}\n{text}" + ("" if last else "<|im_end|>\n"))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)
