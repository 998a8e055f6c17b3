"""POST /v1/embeddings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.prefix_key import prompt_head
from app.prompt import PromptView, content_chars
from app.records import Operation
from app.surfaces.completions import CompletionsSurface


class EmbeddingsSurface(CompletionsSurface):
    """OpenAI embeddings: `input`; never streamed, never normalized, no scheduling fields."""

    name = "embeddings"
    operation: Operation = "embeddings"
    field = "input"
    can_stream = False
    schedules = False
    normalizable = False

    def view(self, body: Mapping[str, Any]) -> PromptView:
        """No head (embeddings are not normalized): the key head and the character count only."""
        value = body.get(self.field)
        return PromptView(key_head=prompt_head(value), text_chars=content_chars(value))
