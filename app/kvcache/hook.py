"""KV-event routing's request glue as a path hook: hash a request's prompt into exact KV blocks before pick
(the kv_events policy scores replicas by them), and learn the blocks of its reply once it finished.

Registered only when some replica publishes KV events; only surfaces whose prompt renders through the chat
template take part (`Surface.hashes_blocks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.hooks import PathHook
from app.kvcache.replies import Hashers, ReplyLearner
from app.kvcache.tokens import ChatRenderError

if TYPE_CHECKING:
    from app.config import ModelConfig
    from app.context import RequestContext


class BlockHashing(PathHook):
    """The prompt's block hashes on the context before pick; the reply's blocks learned after it finished."""

    name = "block_hashing"

    def __init__(self, hashers: Hashers) -> None:
        self.hashers = hashers  # app/kvcache/hashers.py: at the block size the replicas publish
        self.replies = ReplyLearner(hashers)

    async def before_pick(self, ctx: RequestContext, model: ModelConfig) -> None:
        """Exact block hashes for a model whose pool routes on KV events (None: the policy falls back)."""
        hasher = self.hashers.get(model.name) if ctx.surface.hashes_blocks else None
        if hasher is not None:
            try:
                ctx.blocks = hasher.blocks(ctx.body, ctx.cache_salt)
            except ChatRenderError:
                ctx.blocks = None  # a body the gateway cannot render exactly: the policy falls back

    async def finished(self, ctx: RequestContext, cancelled: bool) -> None:
        """A whole reply's blocks become the next turn's predicted prefix."""
        if not cancelled:
            await self.replies.learn(ctx)
