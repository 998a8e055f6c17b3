"""The replica-selection protocol every policy implements (one policy per module)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from app.kvcache.tokens import PromptBlocks
    from app.routing.state import ReplicaState


class Selection(NamedTuple):
    """The chosen replica, the one that would have been next, and a stable reason string."""

    # A NamedTuple, not a frozen dataclass: built on every request, and frozen dataclasses are slow to build.

    chosen: ReplicaState
    runner_up: ReplicaState | None
    reason: str
    cached_tokens: int | None = None  # prompt tokens the chosen replica is predicted to reuse, when known


class Policy(Protocol):
    """Choose one of `candidates` (non-empty, all in rotation) for a request with routing key `key`."""

    name: str

    def select(self, candidates: Sequence[ReplicaState], key: int, blocks: PromptBlocks | None = None) -> Selection:
        """Pick a replica; must not mutate the candidates (in-flight accounting is the caller's). `blocks` are
        the request's exact KV block hashes, when the pool computes them (kv_events)."""
        ...
