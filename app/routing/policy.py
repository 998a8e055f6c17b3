"""The replica-selection protocol every policy implements (one policy per module), and the replica it reads.

Policies type against `ReplicaView`, the few numbers they read of a replica (as the vLLM router's `Worker`
trait), not against the routing state that implements it: a policy is testable with any object that has them,
and routing's state may build policies without a circle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, NamedTuple, Protocol, TypeVar

if TYPE_CHECKING:
    from app.records import PromptBlocks


class ReplicaView(Protocol):
    """What a policy reads of one replica (app/routing/state.py's ReplicaState is the one implementation)."""

    @property
    def url(self) -> str:
        """The replica's base URL (its identity in the event index)."""
        ...

    @property
    def hash(self) -> int:
        """A stable 64-bit hash of the URL (rendezvous scores)."""
        ...

    @property
    def in_flight(self) -> int:
        """This gateway's requests on the replica now."""
        ...

    @property
    def external(self) -> int:
        """Requests the last scrape saw beyond this gateway's own."""
        ...

    @property
    def shared_load(self) -> int:
        """The peers' load snapshot in force (-1: none)."""
        ...

    @property
    def capacity(self) -> int:
        """The engine's max_num_seqs (0: unknown)."""
        ...

    def load(self) -> int:
        """Requests on the replica: in flight plus external."""
        ...

    def queued(self) -> int:
        """Requests waiting in the engine now."""
        ...


R = TypeVar("R", bound=ReplicaView)


class Selection(NamedTuple, Generic[R]):
    """The chosen replica, the one that would have been next, and a stable reason string."""

    # A NamedTuple, not a frozen dataclass: built on every request, and frozen dataclasses are slow to build.

    chosen: R
    runner_up: R | None
    reason: str
    cached_tokens: int | None = None  # prompt tokens the chosen replica is predicted to reuse, when known


class Policy(Protocol):
    """Choose one of `candidates` (non-empty, all in rotation) for a request with routing key `key`."""

    name: str

    def select(self, candidates: Sequence[R], key: int, blocks: PromptBlocks | None = None) -> Selection[R]:
        """Pick a replica; must not mutate the candidates (in-flight accounting is the caller's). `blocks` are
        the request's exact KV block hashes, when the pool computes them (kv_events)."""
        ...
