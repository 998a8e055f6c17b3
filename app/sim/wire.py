"""Response bodies shaped as vLLM 0.32 sends them (field order and nulls included); hot chunks prebuilt as bytes."""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


def usage(prompt: int, completion: int, cached: int | None, details: bool) -> dict[str, Any]:
    """vLLM's UsageInfo; prompt_tokens_details only with --enable-prompt-tokens-details."""
    u: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    u["prompt_tokens_details"] = {"cached_tokens": cached} if details and cached is not None else None
    return u


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event with compact JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class ChatChunks:
    """Streaming chunks of one chat completion; the per-step content chunk is two cached byte strings + text."""

    def __init__(self, rid: str, created: int, model: str) -> None:
        self.rid, self.created, self.model = rid, created, model
        head = f'data: {{"id":"{rid}","object":"chat.completion.chunk","created":{created},"model":'.encode()
        self._head = head + orjson.dumps(model) + b',"choices":[{"index":'
        self._mid = b',"delta":{"content":'
        self._tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'

    def role(self, index: int) -> bytes:
        """The first chunk of a choice: the assistant role and empty content."""
        return sse({
            "id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                         "logprobs": None, "finish_reason": None}],
        })  # fmt: skip

    def content(self, index: int, text: str) -> bytes:
        """A content delta (hot path)."""
        return self._head + str(index).encode() + self._mid + orjson.dumps(text) + self._tail

    def last(self, index: int, text: str, finish_reason: str, use: dict[str, Any] | None = None) -> bytes:
        """The final delta of a choice, carrying its finish_reason."""
        obj: dict[str, Any] = {
            "id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": index, "delta": {"content": text}, "logprobs": None,
                         "finish_reason": finish_reason, "stop_reason": None}],
        }  # fmt: skip
        if use is not None:
            obj["usage"] = use
        return sse(obj)

    def usage_chunk(self, use: dict[str, Any]) -> bytes:
        """The include_usage chunk: `choices: []` and the usage."""
        return sse({"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model, "choices": [], "usage": use})  # fmt: skip


class CompletionChunks:
    """Streaming chunks of one text completion."""

    def __init__(self, rid: str, created: int, model: str) -> None:
        self.rid, self.created, self.model = rid, created, model
        head = f'data: {{"id":"{rid}","object":"text_completion","created":{created},"model":'.encode()
        self._head = head + orjson.dumps(model) + b',"choices":[{"index":'
        self._mid = b',"text":'
        self._tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'

    def role(self, index: int) -> bytes:
        """Completions have no role chunk."""
        return b""

    def content(self, index: int, text: str) -> bytes:
        """A text delta (hot path)."""
        return self._head + str(index).encode() + self._mid + orjson.dumps(text) + self._tail

    def last(self, index: int, text: str, finish_reason: str, use: dict[str, Any] | None = None) -> bytes:
        """The final delta of a choice, carrying its finish_reason."""
        obj: dict[str, Any] = {
            "id": self.rid, "object": "text_completion", "created": self.created, "model": self.model,
            "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason,
                         "stop_reason": None}],
        }  # fmt: skip
        if use is not None:
            obj["usage"] = use
        return sse(obj)

    def usage_chunk(self, use: dict[str, Any]) -> bytes:
        """The include_usage chunk."""
        return sse({"id": self.rid, "object": "text_completion", "created": self.created,
                    "model": self.model, "choices": [], "usage": use})  # fmt: skip


def chat_response(
    rid: str, created: int, model: str, choices: list[tuple[str, str]], use: dict[str, Any]
) -> bytes:
    """A non-streaming chat.completion; choices are (text, finish_reason)."""
    return orjson.dumps({
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                                     "audio": None, "function_call": None, "tool_calls": [], "reasoning": None},
             "logprobs": None, "finish_reason": fr, "stop_reason": None, "token_ids": None}
            for i, (text, fr) in enumerate(choices)
        ],
        "service_tier": None, "system_fingerprint": None, "usage": use,
        "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None,
    })  # fmt: skip


def completion_response(
    rid: str, created: int, model: str, choices: list[tuple[str, str]], use: dict[str, Any]
) -> bytes:
    """A non-streaming text_completion."""
    return orjson.dumps({
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [
            {"index": i, "text": text, "logprobs": None, "finish_reason": fr, "stop_reason": None,
             "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None}
            for i, (text, fr) in enumerate(choices)
        ],
        "service_tier": None, "system_fingerprint": None, "usage": use, "kv_transfer_params": None,
    })  # fmt: skip
