"""One sequence inside the sim engine: its tokens, KV blocks, progress and timestamps."""

from __future__ import annotations

import enum
from collections.abc import Callable

from app.kvcache.hashing import HashAlgo
from app.sim.kv_cache import BLOCK_SIZE, DEFAULT_HASH_ALGO, block_hashes


class Status(enum.Enum):
    """Where the request is in the engine."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class SimRequest:
    """A sequence: prompt + generated tokens, how many have KV computed, and which blocks hold them."""

    __slots__ = (
        "accept",
        "algo",
        "arrival",
        "block_size",
        "blocks",
        "cached_tokens",
        "emit",
        "eos_at",
        "finish_reason",
        "first_token_ts",
        "hashes",
        "ignore_eos",
        "last_token_ts",
        "max_tokens",
        "num_cached_blocks",
        "num_computed",
        "num_output",
        "num_preemptions",
        "num_prompt",
        "out_offset",
        "priority",
        "queued_ts",
        "rid",
        "salt",
        "scheduled_ts",
        "seq",
        "status",
        "tokens",
    )

    def __init__(
        self,
        rid: str,
        prompt: list[int],
        *,
        max_tokens: int,
        eos_at: int | None = None,
        salt: str | None = None,
        priority: int = 0,
        arrival: float = 0.0,
        seq: int = 0,
        out_offset: int = 0,
        emit: Callable[[SimRequest, int], None] | None = None,
        block_size: int = BLOCK_SIZE,
        algo: HashAlgo = DEFAULT_HASH_ALGO,
        accept: float = -1.0,
    ) -> None:
        self.rid = rid
        self.accept = accept  # this request's per-draft-token acceptance; -1: the engine's configured one
        self.block_size = block_size
        self.algo: HashAlgo = algo
        self.tokens = list(prompt)
        self.num_prompt = len(prompt)
        self.max_tokens = max_tokens
        self.eos_at = eos_at  # the output index at which the model emits EOS (None: never)
        self.ignore_eos = eos_at is None
        self.salt = salt
        self.priority = priority
        self.arrival = arrival
        self.seq = seq  # arrival order, the FCFS tie-break
        self.out_offset = out_offset  # where in the seeded output stream this sequence reads
        self.emit = emit  # called with (request, number of new tokens) after each step that produced some
        self.num_output = 0
        self.num_computed = 0
        self.blocks: list[int] = []
        self.hashes: list[bytes] = block_hashes(self.tokens, salt, block_size=block_size, algo=algo)
        self.num_cached_blocks = 0
        self.cached_tokens = -1  # prefix-cache hit at first admission; -1 until admitted
        self.num_preemptions = 0
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.queued_ts = arrival
        self.scheduled_ts = 0.0
        self.first_token_ts = 0.0
        self.last_token_ts = 0.0

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.tokens)

    def extend_hashes(self) -> None:
        """Hash blocks that became full since the last call (generated tokens fill blocks too)."""
        have, bs = len(self.hashes), self.block_size
        if (have + 1) * bs <= len(self.tokens):
            if not have:
                self.hashes = block_hashes(self.tokens, self.salt, block_size=bs, algo=self.algo)
                return
            self.hashes.extend(
                block_hashes(self.tokens, self.salt, block_size=bs, start=have, parent=self.hashes[-1], algo=self.algo)
            )
