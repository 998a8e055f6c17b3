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

    meter.create_observable_counter(
        "gateway.tpot.decisions", [decisions], "{request}",
        "Interactive requests whose pool the predicted TPOT chose, by pool chosen, kind and outcome",
    )
    meter.create_observable_counter(
        "gateway.tpot.predicted", [compared(0)], "s", "Predicted TPOT summed over the requests the prediction routed"
    )
    meter.create_observable_counter(
        "gateway.tpot.observed", [compared(1)], "s", "Observed TPOT summed over the requests the prediction routed"
    )
    meter.create_observable_counter(
        "gateway.tpot.compared", [compared(2)], "{request}", "Requests whose predicted and observed TPOT were compared"
    )
    # No unit "1" on the ratios: the collector would append _ratio and the SDK's exporter not; named with it.
    meter.create_observable_gauge(
        "gateway.tpot.error_ratio", [error], "", "Median |predicted - observed| / observed TPOT, last 256 requests"
    )
    meter.create_observable_gauge(
        "gateway.spec.acceptance_ratio", [acceptance], "", "Accepted / proposed draft tokens per speculative pool"
    )
    meter.create_observable_gauge(
        "gateway.spec.tokens_per_step", [tokens_per_step], "{token}",
        "Expected tokens per decode step on a speculative pool: the pool's (tenant empty) and per tenant and kind",
    )
