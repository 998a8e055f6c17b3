"""What else a model's replicas serve, passed through: /tokenize, /detokenize and vLLM's pooling family.

Each body names its `model` and goes through the same stages as inference (tenancy, limits, class, pick,
failover, settle), but the gateway neither rewrites nor schedules it: no normalization, no `priority` or
`cache_salt` (vLLM's pooling and tokenizer requests take neither), never streamed. Limits count these
requests, not their tokens (the prompt view has no text, so the TPM window is charged nothing); a reply that
reports `usage` (score, rerank, pooling, classify) is priced like embeddings' prompt tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.errors import bad_request
from app.prefix_key import prompt_head
from app.prompt import PromptView, text_of
from app.records import Operation
from app.surfaces.base import Parsed, stream_flag
from app.surfaces.chat.adapter import ChatSurface
from app.surfaces.openai import OpenAISurface, media_free_parts
from app.surfaces.placement import TailPlacement

# The body fields that carry what the request is about, by endpoint family (the first present one keys
# the replica choice and, on opt-in, the span's input messages).
TOKENIZER_FIELDS = ("prompt", "messages", "tokens")
POOLING_FIELDS = ("input", "messages", "query", "queries", "text_1", "data_1", "documents")

_CHAT = ChatSurface()


class PassThroughSurface(OpenAISurface):
    """One vLLM endpoint relayed as it is, but for the served model name (in the body and in `model` of the reply)."""

    operation: Operation
    can_stream = False
    schedules = False
    normalizable = False
    output_cap_fields: tuple[str, ...] = ()  # nothing to cap: these produce no tokens

    def __init__(self, name: str, operation: Operation, fields: tuple[str, ...]) -> None:
        self.name = name
        self.operation = operation
        self._fields = fields

    def validate(self, body: dict[str, Any]) -> Parsed:
        """Only what the gateway itself relies on; vLLM validates the rest and answers its own 400."""
        if stream_flag(body):
            raise bad_request(f"{self.name} cannot be streamed", param="stream")
        return Parsed(stream=False)

    def _subject(self, body: Mapping[str, Any]) -> tuple[str, Any]:
        for field in self._fields:
            value = body.get(field)
            if value is not None:
                return field, value
        return "", None

    def view(self, body: Mapping[str, Any]) -> PromptView:
        """The key head only: text_chars stays 0, so limits charge these requests by count."""
        field, value = self._subject(body)
        if field == "messages" and isinstance(value, list):
            first = value[0] if value and isinstance(value[0], dict) else {}
            return PromptView(key_head=prompt_head(text_of(first.get("content"))))
        return PromptView(key_head=prompt_head(value))

    def place_tail(self, body: dict[str, Any], lines: list[str], placement: TailPlacement) -> dict[str, Any]:
        """Never called (not normalizable): the body as it came."""
        return body

    def input_messages(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Chat-shaped bodies as chat; text inputs (a string or a batch of strings) as user messages."""
        field, value = self._subject(body)
        if field == "messages":
            return _CHAT.input_messages(body)
        values = value if isinstance(value, list) else [value]
        return [{"role": "user", "parts": media_free_parts(v)} for v in values if isinstance(v, str)]


TOKENIZE = PassThroughSurface("tokenize", "tokenize", TOKENIZER_FIELDS)
DETOKENIZE = PassThroughSurface("detokenize", "tokenize", TOKENIZER_FIELDS)
RERANK = PassThroughSurface("rerank", "embeddings", POOLING_FIELDS)
SCORE = PassThroughSurface("score", "embeddings", POOLING_FIELDS)
POOLING = PassThroughSurface("pooling", "embeddings", POOLING_FIELDS)
CLASSIFY = PassThroughSurface("classify", "embeddings", POOLING_FIELDS)

# vLLM 0.32's paths for them (the /v1 and /v2 rerank and the /v1 score are aliases it keeps).
PASSTHROUGH_SURFACES: dict[str, PassThroughSurface] = {
    "/tokenize": TOKENIZE,
    "/detokenize": DETOKENIZE,
    "/rerank": RERANK,
    "/v1/rerank": RERANK,
    "/v2/rerank": RERANK,
    "/score": SCORE,
    "/v1/score": SCORE,
    "/pooling": POOLING,
    "/classify": CLASSIFY,
}
