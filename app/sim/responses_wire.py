"""Responses API bodies and SSE events byte-shaped as vLLM 0.32 sends them (see tests/sim/fixtures/vllm_shapes.json).

vLLM dumps its pydantic models with every field (nulls included) in declaration order; the stream frames each
event as `event: <type>\\ndata: <json>\\n\\n`, numbers events from 0 in `sequence_number`, and ends with
`response.completed` (no `[DONE]`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.sim.surface import Usage

_FUNCTION_TOOL_FIELDS = (
    "name",
    "parameters",
    "strict",
    "type",
    "allowed_callers",
    "async",
    "defer_loading",
    "description",
    "output_schema",
)
_REASONING_FIELDS = ("context", "effort", "generate_summary", "mode", "summary")


def random_id(prefix: str) -> str:
    """vLLM's ids: a prefix and 16 hex digits (random_uuid())."""
    return prefix + secrets.token_hex(8)


def echo_tool(tool: Any) -> Any:
    """A function tool as vLLM echoes it (the openai type's fields, unset ones null); other tools as sent."""
    if isinstance(tool, dict) and tool.get("type") == "function":
        return {k: tool.get(k) for k in _FUNCTION_TOOL_FIELDS}
    return tool


def echo_reasoning(reasoning: Any) -> Any:
    """The `reasoning` object with its unset fields null."""
    if isinstance(reasoning, dict):
        return {k: reasoning.get(k) for k in _REASONING_FIELDS}
    return reasoning


def echo_text(text: Any) -> Any:
    """The `text` config with `verbosity` filled in."""
    if isinstance(text, dict):
        return {"format": text.get("format"), "verbosity": text.get("verbosity")}
    return text


def usage_object(u: Usage) -> dict[str, Any]:
    """ResponseUsage; the per-turn lists stay empty for single-turn (non-harmony) requests, as in vLLM."""
    return {
        "input_tokens": u.prompt,
        "input_tokens_details": {
            "cached_tokens": u.cached,
            "cache_write_tokens": u.created_cache,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": u.completion,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": u.prompt + u.completion,
    }


def output_text(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    """One output_text content part."""
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(item_id: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    """An assistant output message item."""
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": None}


@dataclass(slots=True)
class ResponseShape:
    """Everything a Response object echoes from its request; `.object()` builds the body for one status."""

    rid: str
    created: int
    model: str
    max_output_tokens: int
    instructions: str | None = None
    metadata: Any = None
    parallel_tool_calls: bool = True
    temperature: float = 1.0
    tool_choice: Any = "none"
    tools: list[Any] = field(default_factory=list)
    top_p: float = 1.0
    background: bool = False
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    reasoning: Any = None
    service_tier: str = "auto"
    text: Any = None
    truncation: str = "disabled"
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def object(self, status: str, output: list[dict[str, Any]], usage: Usage | None) -> dict[str, Any]:
        """The `response` object (what GET /v1/responses/{id} and response.completed carry)."""
        return {
            "id": self.rid,
            "created_at": self.created,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": self.instructions,
            "metadata": self.metadata,
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": self.parallel_tool_calls,
            "temperature": self.temperature,
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "top_p": self.top_p,
            "background": self.background,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": self.max_tool_calls,
            "previous_response_id": self.previous_response_id,
            "prompt": None,
            "reasoning": self.reasoning,
            "service_tier": self.service_tier,
            "status": status,
            "text": self.text,
            "top_logprobs": None,
            "truncation": self.truncation,
            "usage": usage_object(usage) if usage is not None else None,
            "user": self.user,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


def status_of(finish_reason: str) -> str:
    """vLLM: `length` makes the response incomplete; everything else is completed."""
    return "incomplete" if finish_reason == "length" else "completed"


def whole_output(text: str, *, with_parser: bool) -> list[dict[str, Any]]:
    """Non-streaming output items: with a tool parser configured vLLM drops an empty message; without, it keeps one."""
    if text:
        return [message_item(random_id("msg_"), [output_text(text, None)], "completed")]
    return [] if with_parser else [message_item(random_id("msg_"), [], "completed")]


class ResponseEvents:
    """The SSE events of one streamed response; text arrives step by step."""

    def __init__(self, shape: ResponseShape) -> None:
        self.shape = shape
        self.seq = 0
        self.item_id = ""
        self.text_parts: list[str] = []
        self.output: list[dict[str, Any]] = []
        self.on_done: Any = None  # called with the final response object (the store)

    def _event(self, obj: dict[str, Any]) -> bytes:
        # vLLM's event models (the openai SDK's) declare their fields alphabetically; sequence_number included.
        obj["sequence_number"] = self.seq
        self.seq += 1
        kind: str = obj["type"]
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(dict(sorted(obj.items()))) + b"\n\n"

    def head(self) -> bytes:
        """response.created and response.in_progress."""
        initial = self.shape.object("in_progress", [], None)
        return self._event({"response": initial, "type": "response.created"}) + self._event(
            {"response": initial, "type": "response.in_progress"}
        )

    def _open(self) -> bytes:
        self.item_id = random_id("msg_")
        return self._event(
            {
                "item": message_item(self.item_id, [], "in_progress"),
                "output_index": 0,
                "type": "response.output_item.added",
            }
        ) + self._event(
            {
                "content_index": 0,
                "item_id": self.item_id,
                "output_index": 0,
                "part": output_text("", []),
                "type": "response.content_part.added",
            }
        )

    def delta(self, text: str) -> bytes:
        """response.output_text.delta (opening the message item on the first text)."""
        head = b"" if self.text_parts else self._open()
        self.text_parts.append(text)
        return head + self._event(
            {
                "content_index": 0,
                "delta": text,
                "item_id": self.item_id,
                "logprobs": [],
                "output_index": 0,
                "type": "response.output_text.delta",
            }
        )

    def tail(self, finish_reason: str, usage: Usage) -> bytes:
        """Close the message item (if any text came) and send response.completed with usage."""
        out = b""
        if self.text_parts:
            text = "".join(self.text_parts)
            part = output_text(text, None)
            item = message_item(self.item_id, [part], "completed")
            out += self._event(
                {
                    "content_index": 0,
                    "item_id": self.item_id,
                    "logprobs": [],
                    "output_index": 0,
                    "text": text,
                    "type": "response.output_text.done",
                }
            )
            out += self._event(
                {
                    "content_index": 0,
                    "item_id": self.item_id,
                    "output_index": 0,
                    "part": part,
                    "type": "response.content_part.done",
                }
            )
            out += self._event({"item": item, "output_index": 0, "type": "response.output_item.done"})
            self.output = [item]
        final = self.shape.object(status_of(finish_reason), self.output, usage)
        if self.on_done is not None:
            self.on_done(final)
        return out + self._event({"response": final, "type": "response.completed"})
