"""Reply learning: once a chat response was sent, hash the conversation's next turn ahead of it.

A proxy never sees its replies tokenized, so the next turn's pick would tokenize the assistant text it carries
on the request path. After the last byte went out, the learner renders this request's messages plus the reply
the client got, up to the next user message, and tokenizes and hashes that text (which seeds RequestBlocks'
piece and prefix caches): the next turn then pays only for its new user message. Replies whose unseen text
would block the event loop noticeably are tokenized on a worker thread (the batch encode releases the GIL);
the caches themselves are touched only on the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from app.kvcache.chat_template import ChatRenderError
from app.kvcache.tokens import effective_salt

if TYPE_CHECKING:
    from app.context import RequestContext
    from app.kvcache.tokens import RequestBlocks


def assistant_message(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The assistant message of a non-stream chat completion as a client sends it back (one choice only)."""
    choices = doc.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
        return None
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


def continues(body: Mapping[str, Any]) -> bool:
    """Whether a client continues this body with the reply as a new assistant turn (one choice, a fresh
    generation prompt, not a continued final message)."""
    n = body.get("n")
    return (
        (n is None or n == 1)
        and body.get("add_generation_prompt", True) is True
        and not body.get("continue_final_message", False)
    )


class Hashers(Protocol):
    """A model's current hasher (app.kvcache.hashers.BlockHashers, or a plain dict)."""

    def get(self, model: str, /) -> RequestBlocks | None:
        """The RequestBlocks `model`'s bodies are hashed with now, or None."""
        ...


class ReplyLearner:
    """Learns the replies of requests a model's RequestBlocks hashed, after they were sent."""

    def __init__(self, hashers: Hashers, *, inline_chars: int = 2048) -> None:
        self.hashers = hashers
        # Unseen text above this is tokenized off the loop (a ≈ 200-token reply costs the loop ≈ 0.3 ms in all).
        self.inline_chars = inline_chars
        self.learned = 0

    async def learn(self, ctx: RequestContext) -> None:
        """Learn the reply of a finished request, if it was a hashed chat request that the client got whole."""
        if ctx.blocks is None or ctx.reply is None or ctx.status != 200 or not continues(ctx.body):
            return
        hasher = self.hashers.get(ctx.model)
        if hasher is None or not hasher.reuses_prefixes:
            return
        reply = ctx.reply()
        if reply is not None:
            await self.learn_reply(hasher, ctx.body, reply, ctx.cache_salt)

    async def learn_reply(
        self, hasher: RequestBlocks, body: Mapping[str, Any], reply: Mapping[str, Any], cache_salt: str | None
    ) -> None:
        """Hash the next turn's prefix for `body` answered by `reply` (a body the template refuses is skipped)."""
        try:
            salt = effective_salt(body, cache_salt)
            text = hasher.next_turn_text(body, reply)
            unseen = hasher.unseen_pieces(text, salt)
            if sum(map(len, unseen)) > self.inline_chars:
                loop = asyncio.get_running_loop()
                hasher.seed_pieces(unseen, await loop.run_in_executor(None, hasher.encode_pieces, unseen))
            hasher.blocks_for_text(text, salt)
        except ChatRenderError:
            return
        self.learned += 1
