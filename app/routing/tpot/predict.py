"""One pool's prediction for one request: the best replica's TTFT + (output tokens - 1) x TPOT."""

from __future__ import annotations

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
    for r in candidates:
        batch = r.in_flight + r.external + 1
        cap = r.capacity
        if cap and batch > cap:
            batch = cap
        step = fit.predict(batch)
        if step is None:
            continue
        tpot = step / tokens_per_step
        total = r.projected_ttft_ms() / 1000.0 + (output_tokens - 1) * tpot
        if total < best_total_s:
            best_total_s, best_tpot = total, tpot
    return best_total_s, best_tpot
