"""Anthropic Messages bodies and SSE events byte-shaped as vLLM 0.32 sends them (tests/sim/fixtures/vllm_shapes.json).

vLLM builds Messages on top of chat completions: usage comes from the chat usage, with Anthropic's split
`input_tokens = prompt - cache_read - cache_creation`; the cache fields are present only when the chat usage has
prompt_tokens_details (--enable-prompt-tokens-details). The stream is message_start (usage: the whole prompt,
output 0), content_block_start / content_block_delta (text_delta)… / content_block_stop, message_delta (stop
reason and the final usage), message_stop.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.sim.protocol import SimHTTPError
from app.sim.surface import Usage


class AnthropicHTTPError(SimHTTPError):
    """An error the Messages handler returns: vLLM translates it to `{"type": "error", "error": {type, message}}`."""

    def body(self) -> bytes:
        """The Anthropic envelope (vLLM keeps its own error type names, e.g. NotFoundError)."""
        return orjson.dumps({"type": "error", "error": {"type": self.err_type, "message": self.message}})

    @classmethod
    def wrap(cls, e: SimHTTPError) -> AnthropicHTTPError:
        """The same error in the Anthropic envelope."""
        return cls(e.status, e.message, e.err_type, e.param)


def usage_object(u: Usage, *, details: bool) -> dict[str, Any]:
    """vLLM's _build_anthropic_usage of the chat usage."""
    if not details:
        return {"input_tokens": u.prompt, "output_tokens": u.completion}
    return {
        "input_tokens": max(0, u.prompt - u.cached - u.created_cache),
        "output_tokens": u.completion,
        "cache_creation_input_tokens": u.created_cache,
        "cache_read_input_tokens": u.cached,
    }


def stop_reason(finish_reason: str) -> str:
    """Chat finish_reason -> Anthropic stop_reason (the sim never matches stop strings or calls tools)."""
    return "max_tokens" if finish_reason == "length" else "end_turn"


def message_body(mid: str, model: str, text: str, finish_reason: str, u: Usage, *, details: bool) -> bytes:
    """The non-streaming message (vLLM dumps it with exclude_none: no stop_sequence, no kv_transfer_params)."""
    return orjson.dumps(
        {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "model": model,
            "stop_reason": stop_reason(finish_reason),
            "usage": usage_object(u, details=details),
        }
    )


def count_tokens_body(n: int) -> bytes:
    """count_tokens' answer."""
    return orjson.dumps({"input_tokens": n, "context_management": {"original_input_tokens": n}})


def _event(kind: bytes, obj: dict[str, Any]) -> bytes:
    return b"event: " + kind + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


class MessageEvents:
    """The SSE events of one streamed message."""

    def __init__(self, mid: str, model: str, prompt_tokens: int, *, details: bool) -> None:
        self.mid, self.model, self.prompt_tokens, self.details = mid, model, prompt_tokens, details
        self.open = False
        self._delta_head = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":'
        )

    def head(self) -> bytes:
        """message_start (sent with the first step, as vLLM converts the chat role chunk)."""
        return _event(
            b"message_start",
            {
                "type": "message_start",
                "message": {
                    "id": self.mid,
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": self.model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
                },
            },
        )

    def delta(self, text: str) -> bytes:
        """A text_delta (opening the text block on the first text)."""
        out = b""
        if not self.open:
            self.open = True
            out = _event(
                b"content_block_start",
                {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0},
            )
        return out + self._delta_head + orjson.dumps(text) + b'},"index":0}\n\n'

    def tail(self, finish_reason: str, usage: Usage) -> bytes:
        """content_block_stop (if a block is open), message_delta with the usage, message_stop."""
        out = _event(b"content_block_stop", {"type": "content_block_stop", "index": 0}) if self.open else b""
        out += _event(
            b"message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(finish_reason), "stop_sequence": None},
                "usage": usage_object(usage, details=self.details),
            },
        )
        return out + b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
