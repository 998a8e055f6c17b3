"""The TPOT router on /metrics, read from its state at each collection (nothing per request):

gateway.tpot.decisions{pool,kind,outcome}   interactive requests whose pool the prediction chose
gateway.tpot.predicted / .observed{pool}    TPOT seconds summed over those requests (÷ .compared = the means)
gateway.tpot.error_ratio{pool}              median |predicted - observed| / observed over the last 256
gateway.spec.acceptance_ratio{pool}         accepted / proposed draft tokens (the engines' counters)
gateway.spec.tokens_per_step{pool,tenant,kind}  expected tokens per decode step (tenant "" = the pool's)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from app.routing.tpot.kind import KINDS
from app.routing.tpot.router import OUTCOMES, TpotRouter
from app.telemetry import instruments as ins

Callback = Callable[[CallbackOptions], Iterable[Observation]]


def register_tpot_metrics(meter: Meter, router: TpotRouter) -> None:
    """Register the observable instruments above on `meter`."""

    def decisions(options: CallbackOptions) -> Iterable[Observation]:
        # Every (pool, kind, outcome) from the start, zeros too: a panel shows "none yet" rather than no data.
        for pool in router.pools:
            for kind in KINDS:
                for outcome in OUTCOMES:
                    n = router.decisions.get((pool, kind, outcome), 0)
                    yield Observation(n, {"pool": pool, "kind": kind, "outcome": outcome})

    def compared(column: int) -> Callback:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for pool, row in router.compared.items():
                yield Observation(row[column], {"pool": pool})

        return callback

    def error(options: CallbackOptions) -> Iterable[Observation]:
        for pool in router.compared:
            e = router.median_error(pool)
            if e is not None:
                yield Observation(e, {"pool": pool})

    def acceptance(options: CallbackOptions) -> Iterable[Observation]:
        for name, model in router.pools.items():
            rate = model.acceptance.rate() if model.speculative else None
            if rate is not None:
                yield Observation(rate, {"pool": name})

    def tokens_per_step(options: CallbackOptions) -> Iterable[Observation]:
        for name, model in router.pools.items():
            if not model.speculative:
                continue
            yield Observation(model.acceptance.tokens_per_step(), {"pool": name, "tenant": "", "kind": ""})
            for tenant, kind, value in model.acceptance.by_key():
                yield Observation(value, {"pool": name, "tenant": tenant, "kind": kind})

    for spec, callback in (
        (ins.TPOT_DECISIONS, decisions), (ins.TPOT_PREDICTED, compared(0)), (ins.TPOT_OBSERVED, compared(1)),
        (ins.TPOT_COMPARED, compared(2)), (ins.TPOT_ERROR, error), (ins.SPEC_ACCEPTANCE, acceptance),
        (ins.SPEC_TOKENS_PER_STEP, tokens_per_step),
    ):
        ins.observe(meter, spec, callback)
