"""One adapter per API surface; the table maps each inference path to its adapter."""

from __future__ import annotations

from app.api.surfaces.base import Parsed, StreamObserver, Surface
from app.api.surfaces.chat import ChatSurface
from app.api.surfaces.completions import CompletionsSurface
from app.api.surfaces.embeddings import EmbeddingsSurface

CHAT = ChatSurface()
COMPLETIONS = CompletionsSurface()
EMBEDDINGS = EmbeddingsSurface()

# Adapters hold no state: one instance each serves every request.
SURFACES: dict[str, Surface] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
}

__all__ = ["CHAT", "COMPLETIONS", "EMBEDDINGS", "SURFACES", "Parsed", "StreamObserver", "Surface"]
