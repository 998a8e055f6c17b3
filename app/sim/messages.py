"""POST /v1/messages and /v1/messages/count_tokens as vLLM 0.32 serves them, on the sim's engine.

vLLM converts a Messages request to a chat completion (AnthropicServingMessages.to_chat_completion_request) and
runs it through the chat path; the sim does the same conversion and reuses the chat parser, so validation,
rendering and prefix caching are the chat endpoint's. Errors the handler returns are wrapped in the Anthropic
envelope; body validation errors (FastAPI's) keep the OpenAI one, as in vLLM.

The conversion is written apart from the gateway's (app/surfaces/messages/to_chat.py) on purpose: the sim is the
gateway's test double for vLLM, and one shared copy would let a bug in the gateway's conversion pass every test
that runs against the sim (the recorded vLLM fixtures pin both copies to vLLM's own output).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from app.sim.messages_wire import AnthropicHTTPError, MessageEvents, count_tokens_body, message_body
from app.sim.protocol import SimHTTPError, parse_generation
from app.sim.state import SimState
from app.sim.surface import Job, Usage, decode_error
from app.sim.template import TemplateError
from app.sim.validation import BodyErrors

BILLING_PREFIX = "x-anthropic-billing-header"  # vLLM drops system blocks starting with this (cch= defeats caching)
_ROLES = ("user", "assistant", "system")


def _validate(body: Any, *, count_only: bool) -> dict[str, Any]:
    """AnthropicMessagesRequest / AnthropicCountTokensRequest field checks (pydantic's errors, collected)."""
    if not isinstance(body, dict):
        raise SimHTTPError(400, "Expected a JSON object", "Bad Request", None)
    v = BodyErrors(body)
    model = v.str_("model", required=True)
    if model == "":
        v.value_error("model", "Model is required", model)
    msgs = v.list_("messages", required=True)
    for i, m in enumerate(msgs or []):
        if not isinstance(m, dict):
            v.add(
                "model_type", f"messages.{i}", "Input should be a valid dictionary or instance of AnthropicMessage", m
            )
            continue
        if "role" not in m:
            v.add("missing", f"messages.{i}.role", "Field required", m)
        elif m["role"] not in _ROLES:
            v.add("literal_error", f"messages.{i}.role", "Input should be 'user', 'assistant' or 'system'", m["role"])
        if "content" not in m:
            v.add("missing", f"messages.{i}.content", "Field required", m)
        elif not isinstance(m["content"], str | list):
            v.add("string_type", f"messages.{i}.content", "Input should be a valid string", m["content"])
            v.add("list_type", f"messages.{i}.content", "Input should be a valid list", m["content"])
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        v.add("string_type", "system", "Input should be a valid string", system)
        v.add("list_type", "system", "Input should be a valid list", system)
    if not count_only:
        max_tokens = v.int_("max_tokens", required=True)
        if max_tokens is not None and max_tokens <= 0:
            v.value_error("max_tokens", "max_tokens must be positive", max_tokens)
        v.bool_("stream")
        v.float_("temperature")
        v.float_("top_p")
        v.int_("top_k")
    tools = v.list_("tools")
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict) or "name" not in t or "input_schema" not in t:
            v.add(
                "missing",
                f"tools.{i}.{'input_schema' if isinstance(t, dict) and 'name' in t else 'name'}",
                "Field required",
                t,
            )
    v.raise_if_any()
    return body


def _block_text(blocks: Any) -> str | None:
    if isinstance(blocks, str):
        return None if blocks.startswith(BILLING_PREFIX) else blocks
    parts = [
        b["text"]
        for b in blocks
        if isinstance(b, dict)
        and b.get("type") == "text"
        and b.get("text")
        and not b["text"].startswith(BILLING_PREFIX)
    ]
    return "".join(parts) if parts else None


def to_chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's _convert_system_message + _convert_messages (SmolLM2's template takes inline system turns as is)."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        text = _block_text(system) if isinstance(system, list) else system
        if text:
            out.append({"role": "system", "content": text})
    for msg in body["messages"]:
        role, content = msg["role"], msg["content"]
        if role == "system":
            text = _block_text(content)
            if text:
                out.append({"role": "system", "content": text})
            continue
        chat: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            chat["content"] = content
        else:
            parts: list[dict[str, Any]] = []
            calls: list[dict[str, Any]] = []
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind == "text" and block.get("text"):
                    parts.append({"type": "text", "text": block["text"]})
                elif kind == "image" and block.get("source"):
                    parts.append({"type": "image_url", "image_url": {"url": "image"}})
                elif kind == "tool_use":
                    calls.append(
                        {
                            "id": block.get("id") or "call_0",
                            "type": "function",
                            "function": {
                                "name": block.get("name") or "",
                                "arguments": json.dumps(block.get("input") or {}),
                            },
                        }
                    )
                elif kind == "tool_result":
                    result = block.get("content")
                    if role == "user":
                        text = (
                            result
                            if isinstance(result, str)
                            else "\n".join(
                                r.get("text", "")
                                for r in result or []
                                if isinstance(r, dict) and r.get("type") == "text"
                            )
                        )
                        out.append(
                            {"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text or ""}
                        )
                    else:
                        parts.append({"type": "text", "text": f"Tool result: {result if result else ''}"})
            if calls:
                chat["tool_calls"] = calls
            if parts:
                chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
        if not (role == "user" and "content" not in chat):
            out.append(chat)
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Anthropic tools as chat tools."""
    if tools is None:
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description"),
                "parameters": {"type": "object", **t["input_schema"]},
                "strict": t.get("strict"),
                "defer_loading": t.get("defer_loading"),
            },
        }
        for t in tools
    ]


def chat_tool_choice(body: dict[str, Any]) -> Any:
    """Anthropic tool_choice -> chat tool_choice (auto when tools come without one)."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return "auto" if body.get("tools") else None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind), "auto")


class MessagesSurface:
    """The Messages API around the shared engine endpoint."""

    head_first = False

    def __init__(self, state: SimState) -> None:
        self.state = state

    def decode_error(self, raw: bytes) -> SimHTTPError:
        """Malformed JSON (FastAPI's body, the OpenAI envelope)."""
        return decode_error(raw)

    def parse(self, body: Any, rid: str, headers: dict[bytes, bytes]) -> Job:
        """Validate, convert to a chat request and parse that as the chat endpoint does."""
        st, opts = self.state, self.state.options
        body = _validate(body, count_only=False)
        chat = {
            "model": body["model"],
            "messages": to_chat_messages(body),
            "max_tokens": body["max_tokens"],
            "stream": bool(body.get("stream")),
            "ignore_eos": bool(body.get("ignore_eos", False)),
        }
        for key in ("cache_salt", "seed"):
            if key in body:
                chat[key] = body[key]
        if body.get("tools") is not None:
            chat["tools"], chat["tool_choice"] = chat_tools(body["tools"]), chat_tool_choice(body)
        prio = headers.get(b"x-vllm-priority")
        try:
            gen = parse_generation(
                "chat",
                chat,
                tokenizer=st.tokenizer,
                chat=st.chat,
                served_model=opts.model,
                max_model_len=st.sched_config.max_model_len,
                priority_enabled=st.sched_config.policy == "priority",
                header_priority=prio.decode() if prio is not None else None,
                default_system=st.default_system,
                render_tools=opts.render_tools,
                auto_tool_choice=opts.enable_auto_tool_choice,
                tool_parser=opts.tool_call_parser,
            )
        except SimHTTPError as e:
            raise AnthropicHTTPError.wrap(e) from None
        return Job(
            gen.prompt_ids,
            gen.max_tokens,
            gen.stream,
            seed=gen.seed,
            ignore_eos=gen.ignore_eos,
            salt=gen.salt,
            priority=gen.priority,
            extra={"id": "chatcmpl-" + rid},
        )

    def whole(self, job: Job, text: str, finish_reason: str, usage: Usage) -> bytes:
        """The non-streaming message."""
        opts = self.state.options
        return message_body(
            job.extra["id"], opts.model, text, finish_reason, usage, details=opts.enable_prompt_tokens_details
        )

    def writer(self, job: Job) -> MessageEvents:
        """The event writer for a streamed message."""
        opts = self.state.options
        return MessageEvents(
            job.extra["id"], opts.model, len(job.prompt_ids), details=opts.enable_prompt_tokens_details
        )

    async def count_tokens(self, request: Request) -> Response:
        """POST /v1/messages/count_tokens: the rendered chat prompt's length."""
        st, opts = self.state, self.state.options
        raw = await request.body()
        try:
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise decode_error(raw) from None
            body = _validate(body, count_only=True)
            if body["model"] != opts.model:
                raise AnthropicHTTPError(
                    404,
                    f"The model `{body['model']}` does not exist. Valid aliases: {opts.model}.",
                    "NotFoundError",
                    "model",
                )
            tools = chat_tools(body.get("tools")) if body.get("tools") else None
            try:
                ids = st.chat.token_ids({"messages": to_chat_messages(body), "tools": tools})
            except TemplateError as e:
                raise AnthropicHTTPError(400, str(e), "BadRequestError", "messages") from None
        except SimHTTPError as e:
            return Response(e.body(), status_code=e.status, media_type="application/json")
        return Response(count_tokens_body(len(ids)), media_type="application/json")
