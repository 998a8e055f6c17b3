"""POST /v1/completions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.errors import bad_request
from app.prefix_key import prompt_head
from app.prompt import PromptView, TextSlot, content_chars
from app.records import Operation
from app.surfaces.openai import OpenAISurface, media_free_parts
from app.surfaces.placement import TailPlacement, place_in_prompt


class CompletionsSurface(OpenAISurface):
    """OpenAI text completions: a `prompt` string, token ids, or a batch of either."""

    name = "completions"
    operation: Operation = "text_completion"
    field = "prompt"

    def validate_fields(self, body: dict[str, Any]) -> None:
        """`prompt` is a string or a non-empty list."""
        value = body.get(self.field)
        if not isinstance(value, str | list) or (isinstance(value, list) and not value):
            raise bad_request(f"'{self.field}' must be a string or a non-empty array", param=self.field)

    def view(self, body: Mapping[str, Any]) -> PromptView:
        """A string prompt is the head; token ids and batches are left alone by normalize."""
        prompt = body.get(self.field)
        head = (TextSlot((self.field,), prompt, -1, -1),) if isinstance(prompt, str) else ()
        return PromptView(head=head, key_head=prompt_head(prompt), text_chars=content_chars(prompt))

    def place_tail(self, body: dict[str, Any], lines: list[str], placement: TailPlacement) -> dict[str, Any]:
        """The block goes before the prompt's last line (the completion cue stays last)."""
        return {**body, self.field: place_in_prompt(body[self.field], lines)}

    def input_messages(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Each string prompt as a user message."""
        prompt = body.get(self.field)
        prompts = prompt if isinstance(prompt, list) else [prompt]
        return [{"role": "user", "parts": media_free_parts(p)} for p in prompts if isinstance(p, str)]
