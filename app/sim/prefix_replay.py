"""A prefix-cache replay of request bodies: render a body as `kvgate sim` does, then hash it in chained blocks
(normalize's capture tests and experiments/normalize_captures.py read cached/prompt from it offline).

The sim converts Messages and Responses bodies to chat messages the way vLLM does (app/sim/messages.py,
app/sim/responses.py) and renders them with tools after the first system text (app/sim/template.py, the
Qwen/Hermes layout the issue's numbers come from) and tokenizes them with its built-in tokenizer (what the lab's
sims run). The cache here is vLLM's prefix cache reduced to what a ratio needs: full 16-token blocks chained by
hash, one unlimited cache, a request's hit = its longest run of leading blocks already seen (the last token is
always computed, as vLLM does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.sim.messages import chat_tools as messages_tools
from app.sim.messages import to_chat_messages
from app.sim.responses import chat_tools as responses_tools
from app.sim.responses import input_messages
from app.sim.template import render_chat
from app.sim.tokenizer import FallbackTokenizer

BLOCK_TOKENS = 16
_TOKENIZER = FallbackTokenizer()


def render(surface: str, body: dict[str, Any]) -> str:
    """The prompt text the sim renders for a body of `surface` (chat, messages, responses)."""
    if surface == "messages":
        return render_chat(to_chat_messages(body), tools=messages_tools(body.get("tools")))
    if surface == "responses":
        instructions = body.get("instructions")
        messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
        items = body["input"]
        messages += [{"role": "user", "content": items}] if isinstance(items, str) else input_messages(items)
        for m in messages:  # the sim's template reads text parts only; Responses' input_text is one
            if isinstance(m.get("content"), list):
                m["content"] = [
                    {"type": "text", "text": p.get("text", "")} if isinstance(p, dict) else p for p in m["content"]
                ]
        return render_chat(messages, tools=responses_tools(body.get("tools") or []) or None)
    return render_chat(body["messages"], tools=body.get("tools"))


@dataclass
class PrefixCache:
    """Chained block hashes of every prompt seen; `serve` says how much of a new prompt was already cached."""

    blocks: set[int] = field(default_factory=set)

    def serve(self, prompt: str) -> tuple[int, int]:
        """(cached tokens, prompt tokens) for one request, then cache its blocks."""
        ids = _TOKENIZER.encode(prompt)
        n_full = (len(ids) - 1) // BLOCK_TOKENS  # the last token is always computed
        parent = 0
        hit = 0
        missed = False
        for i in range(n_full):
            parent = hash((parent, tuple(ids[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS])))
            if not missed and parent in self.blocks:
                hit += 1
            else:
                missed = True
                self.blocks.add(parent)
        return hit * BLOCK_TOKENS, len(ids)
