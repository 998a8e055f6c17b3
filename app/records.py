"""Plain value records that stages and API surfaces both fill: token usage, timestamps, the pre-call estimate.

They sit below the request context and the surfaces alike (they import nothing of app/), so a surface can
account into a request without knowing the context's type, and the context can name its surface's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Operation = Literal["chat", "text_completion", "embeddings", "tokenize"]


@dataclass(slots=True)
class Usage:
    """Token counts as the upstream reported them (cached ⊆ prompt)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reported: bool = False

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens that paid for prefill."""
        return max(self.prompt_tokens - self.cached_tokens, 0)

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class Timing:
    """Monotonic timestamps (time.perf_counter) the settle stage turns into latencies."""

    start: float = 0.0
    upstream_start: float = 0.0
    first_token: float = 0.0
    end: float = 0.0
    upstream_busy: float = 0.0  # seconds spent waiting on the upstream, excluded from overhead


@dataclass(frozen=True, slots=True)
class CallEstimate:
    """A request's predicted tokens on its picked replica."""

    prompt_tokens: int
    cached_tokens: int  # ≤ prompt_tokens: the picked replica's predicted prefix reuse
    output_tokens: int  # the output cap (0: none set)
    exact: bool  # prompt_tokens is the tokenizer's count, not the character estimate


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A request's prompt length in tokens and its block hashes (ints, as vLLM's KV events publish them), hashed
    in blocks of `block_size` tokens (the replicas' own: app/kvcache/hashers.py)."""

    n_tokens: int
    hashes: list[int]
    block_size: int = 16


class PickedReplica(Protocol):
    """The replica pick chose, as the request's record names it (app/routing/state.py's ReplicaState; only the
    dispatcher, which leases it, reads more of it)."""

    @property
    def url(self) -> str:
        """The replica's base URL."""
        ...

    @property
    def pool(self) -> str:
        """The pool it belongs to."""
        ...
