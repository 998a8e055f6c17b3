"""One adapter per API surface; the table maps each inference path to its adapter."""

from __future__ import annotations

from app.api.surfaces.base import Parsed, StreamObserver, Surface
from app.api.surfaces.chat import ChatSurface
from app.api.surfaces.completions import CompletionsSurface
from app.api.surfaces.embeddings import EmbeddingsSurface
from app.api.surfaces.messages import CountTokensSurface, MessagesSurface
from app.api.surfaces.passthrough import PASSTHROUGH_SURFACES
from app.api.surfaces.responses import ResponsesSurface

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
