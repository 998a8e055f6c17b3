"""Response bodies byte-shaped as vLLM 0.32 sends them (captured from a real server); hot chunks prebuilt."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
VLLM_VERSION = "0.32.0"


def system_fingerprint(model: str) -> str:
    """vLLM's `vllm-<version>-<8 hex>`; stable per served model here."""
    return f"vllm-{VLLM_VERSION}-{hashlib.blake2b(model.encode(), digest_size=4).hexdigest()}"


def usage(
    kind: str,
    *,
    streaming: bool,
    prompt: int,
    completion: int,
    cached: int,
    created_cache: int,
    details: bool,
) -> dict[str, Any]:
    """vLLM's UsageInfo: its prompt_tokens_details differ between chat/completions and stream/whole."""
    u: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    if streaming:
        if details:
            u["prompt_tokens_details"] = (
                {"cached_tokens": cached, "created_cache_tokens": created_cache}
                if kind == "chat"
                else {"cached_tokens": cached}
            )
        return u
    u["prompt_tokens_details"] = (
        {"cached_tokens": cached, "created_cache_tokens": created_cache if kind == "chat" else None,
         "multimodal_tokens": None}
        if details
        else None
    )
    u["completion_tokens_details"] = None
    return u


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event with compact JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class _Chunks:
    object_name = ""

    def __init__(self, rid: str, created: int, model: str) -> None:
        self.rid, self.created, self.model = rid, created, model
        self.fingerprint = system_fingerprint(model)
        self._head = (
            f'data: {{"id":"{rid}","object":"{self.object_name}","created":{created},"model":'.encode()
            + orjson.dumps(model)
            + b',"choices":[{"index":'
        )

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.rid, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": choices}

    def usage_chunk(self, use: dict[str, Any]) -> bytes:
        """The include_usage chunk: `choices: []`, the usage, the fingerprint."""
        obj = self._envelope([])
        obj["usage"] = use
        obj["system_fingerprint"] = self.fingerprint
        return sse(obj)


class ChatChunks(_Chunks):
    """Streaming chunks of one chat completion; a content chunk is cached bytes + the text."""

    object_name = "chat.completion.chunk"

    def __init__(self, rid: str, created: int, model: str) -> None:
        super().__init__(rid, created, model)
        self._mid = b',"delta":{"content":'
        self._tail = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'

    def role(self, index: int) -> bytes:
        """The first chunk of a choice: the assistant role and empty content."""
        obj = self._envelope(
            [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
        )
        obj["prompt_token_ids"] = None
        obj["prompt_text"] = None
        return sse(obj)

    def content(self, index: int, text_json: bytes) -> bytes:
        """A content delta (the hot path); `text_json` is the text already as a JSON string literal."""
        return self._head + str(index).encode() + self._mid + text_json + self._tail

    def delta(self, index: int, text: str, finish_reason: str | None, use: dict[str, Any] | None) -> bytes:
        """A delta with optional finish_reason and continuous usage."""
        choice: dict[str, Any] = {"index": index, "delta": {"content": text}, "logprobs": None,
                                  "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        obj = self._envelope([choice])
        if use is not None:
            obj["usage"] = use
        return sse(obj)


class CompletionChunks(_Chunks):
    """Streaming chunks of one text completion (no role chunk)."""

    object_name = "text_completion"

    def __init__(self, rid: str, created: int, model: str) -> None:
        super().__init__(rid, created, model)
        self._mid = b',"text":'
        self._tail = (
            b',"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}'
            b"\n\n"
        )

    def role(self, index: int) -> bytes:
        """Completions send no role chunk."""
        return b""

    def content(self, index: int, text_json: bytes) -> bytes:
        """A text delta (the hot path); `text_json` is the text already as a JSON string literal."""
        return self._head + str(index).encode() + self._mid + text_json + self._tail

    def delta(self, index: int, text: str, finish_reason: str | None, use: dict[str, Any] | None) -> bytes:
        """A delta with optional finish_reason and continuous usage."""
        obj = self._envelope([{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason,
                               "stop_reason": None, "prompt_token_ids": None, "token_ids": None}])
        if use is not None:
            obj["usage"] = use
        return sse(obj)


def chat_response(
    rid: str, created: int, model: str, choices: list[tuple[str, str]], use: dict[str, Any]
) -> bytes:
    """A non-streaming chat.completion; choices are (text, finish_reason)."""
    return orjson.dumps({
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                                     "audio": None, "function_call": None, "reasoning": None},
             "logprobs": None, "finish_reason": fr, "stop_reason": None, "token_ids": None, "routed_experts": None}
            for i, (text, fr) in enumerate(choices)
        ],
        "service_tier": None, "system_fingerprint": system_fingerprint(model), "usage": use,
        "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
        "ec_transfer_params": None, "metrics": None,
    })


def completion_response(
    rid: str, created: int, model: str, choices: list[tuple[str, str]], use: dict[str, Any]
) -> bytes:
    """A non-streaming text_completion."""
    return orjson.dumps({
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [
            {"index": i, "text": text, "logprobs": None, "finish_reason": fr, "stop_reason": None,
             "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
            for i, (text, fr) in enumerate(choices)
        ],
        "service_tier": None, "system_fingerprint": system_fingerprint(model), "usage": use,
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
    })
