"""One adapter per API surface; the table maps each inference path to its adapter."""

from __future__ import annotations

from app.surfaces.base import Parsed, StreamObserver, Surface
from app.surfaces.chat.adapter import ChatSurface
from app.surfaces.completions import CompletionsSurface
from app.surfaces.embeddings import EmbeddingsSurface
from app.surfaces.messages.adapter import CountTokensSurface, MessagesSurface
from app.surfaces.passthrough import PASSTHROUGH_SURFACES
from app.surfaces.responses.adapter import ResponsesSurface

CHAT = ChatSurface()
COMPLETIONS = CompletionsSurface()
EMBEDDINGS = EmbeddingsSurface()
RESPONSES = ResponsesSurface()
MESSAGES = MessagesSurface()
COUNT_TOKENS = CountTokensSurface()

# Adapters hold no state: one instance each serves every request.
SURFACES: dict[str, Surface] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": COUNT_TOKENS,
    **PASSTHROUGH_SURFACES,
}

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "COUNT_TOKENS",
    "EMBEDDINGS",
    "MESSAGES",
    "RESPONSES",
    "SURFACES",
    "Parsed",
    "StreamObserver",
    "Surface",
]
