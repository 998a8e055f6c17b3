"""One pool's prediction for one request: the best replica's TTFT + (output tokens - 1) x TPOT.

TPOT is the step time at the decode batch the request will share over its life, over its tokens per step. That
batch is not the one at the pick: the sequences in flight finish and others arrive, and over a request's life the
batch reverts toward the replica's recent level (BatchLevel). With sequences living an exponential `T` s, the
batch expected `s` s on is level + (now - level)·e^(-s/T); over a life of `D` s that averages to
level + (now - level)·(T/D)(1 - e^(-D/T)). Pricing the batch at the pick instead missed by a median 23 % on a
speculative pool near saturation (experiments/tpot_model_eval.py --diagnose), and the router's own choices made
it worse: a pool is picked when its batch is momentarily low, and that is when it will rise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from app.routing.state import ReplicaState
from app.routing.tpot.pool_model import PoolModel


@dataclass(slots=True)
class Prediction:
    """What decided an interactive request's pool (x-kvgate-route, the span, and settle's comparison)."""

    pool: str  # the pool chosen
    kind: str
    tpot_s: float  # predicted TPOT on the chosen pool
    totals: tuple[tuple[str, float], ...]  # (pool, predicted seconds to the last token), home first
    outcome: str  # kept | moved | affinity (would have moved but for the prefill it would lose)

    def header(self) -> str:
        """`;fast=412ms;bulk=655ms;tpot=3.10ms;kind=code`, appended after `pick=tpot`."""
        totals = "".join(f";{name}={s * 1000.0:.0f}ms" for name, s in self.totals)
        return f"{totals};tpot={self.tpot_s * 1000.0:.2f}ms;kind={self.kind}"


def best_total(
    model: PoolModel, candidates: Sequence[ReplicaState], tokens_per_step: float, output_tokens: int
) -> tuple[float, float]:
    """(seconds to the last token, TPOT) on the candidate where the request would end first.

    The request joins the replica's decode batch (its load + 1, at most its max_num_seqs); beyond that it waits,
    which the projected TTFT (queue ahead scaled) already holds.
    """
    best_total_s = best_tpot = float("inf")
    fit = model.fit
    levels = model.levels
    for r in candidates:
        others = r.in_flight + r.external
        cap = r.capacity
        batch = others + 1
        if cap and batch > cap:
            batch = cap
        step = fit.predict(batch)
        if step is None:
            continue
        level = levels.get(r.url)
        if level is not None and level.lifetime_s > 0.0 and output_tokens > 1:
            life = (output_tokens - 1) * step / tokens_per_step
            batch = expected_batch(others, level.level, level.lifetime_s, life, cap)
            step = fit.predict(batch) or step
        tpot = step / tokens_per_step
        total = r.projected_ttft_ms() / 1000.0 + (output_tokens - 1) * tpot
        if total < best_total_s:
            best_total_s, best_tpot = total, tpot
    return best_total_s, best_tpot


def expected_batch(others: int, level: float, lifetime_s: float, life_s: float, cap: int) -> int:
    """The decode batch a request joining `others` sequences shares on average over its `life_s` seconds, as
    the module docstring derives (itself included; at most `cap` when the capacity is known)."""
    x = life_s / lifetime_s
    keep = (1.0 - math.exp(-x)) / x if x > 1e-6 else 1.0
    batch = int(1.5 + level + (others - level) * keep)
    return min(batch, cap) if cap else max(batch, 1)
