"""Plain value records that stages and API surfaces both fill: token usage, timestamps, the pre-call estimate.

They sit below the request context and the surfaces alike (they import nothing of app/), so a surface can
account into a request without knowing the context's type, and the context can name its surface's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

_PER_M = 1_000_000.0

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
class TokenPrices:
    """USD per token for uncached input, cached input and output."""

    input_per_token: float
    cached_input_per_token: float
    output_per_token: float

    @classmethod
    def per_million(cls, input_per_m: float, cached_input_per_m: float, output_per_m: float) -> TokenPrices:
        """From the config's $ per million tokens (divided once, so a request's cost is three multiply-adds)."""
        return cls(input_per_m / _PER_M, cached_input_per_m / _PER_M, output_per_m / _PER_M)


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


class RoutePrediction(Protocol):
    """The predicted times that chose a request's pool (app/routing/tpot's Prediction), as the record carries them."""

    @property
    def pool(self) -> str:
        """The pool the prediction chose."""
        ...

    @property
    def kind(self) -> str:
        """The request's kind (code, tool, prose)."""
        ...

    @property
    def outcome(self) -> str:
        """kept | moved | affinity."""
        ...

    @property
    def tpot_s(self) -> float:
        """Predicted time per output token on the chosen pool."""
        ...

    def header(self) -> str:
        """The text x-kvgate-route ends with."""
        ...


class PoolChooser(Protocol):
    """Chooses between a model's two pools for an interactive request (app/routing/tpot's TpotRouter): given the
    home and other PoolState with their candidate ReplicaStates, the body, tenant, session key and prompt size."""

    def choose(
        self,
        home: Any,
        home_candidates: Sequence[Any],
        other: Any,
        other_candidates: Sequence[Any],
        body: Mapping[str, Any],
        tenant: str,
        session: int,
        prompt_tokens: int,
    ) -> RoutePrediction | None:
        """The prediction that names the pool, or None when it does not engage."""
        ...
