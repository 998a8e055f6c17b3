"""The TPOT chooser: which of a model's two pools an interactive request should go to, and what settle teaches it.

pick() asks `choose` when the model has an interactive and a bulk pool, both with replicas in rotation; None
means "not engaged" (a pool lacks data, or the feature is off) and pick goes on by class and spill-over. The
request stays on its incumbent pool (its session's last pool, else its class's) unless the other ends it sooner by
`hysteresis`, counting for a known session the prefill of the prompt the other pool does not hold.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.config.tpot import TpotSettings
from app.routing.state import PoolState, ReplicaState
from app.routing.tpot.acceptance import Mean
from app.routing.tpot.kind import request_kind
from app.routing.tpot.pool_model import PoolModel
from app.routing.tpot.predict import Prediction, best_total

if TYPE_CHECKING:
    from collections.abc import Sequence

    from app.config import GatewayConfig
    from app.context import RequestContext

OUTCOMES = ("kept", "moved", "affinity", "probe")
ERROR_WINDOW = 256  # per pool: the last requests' |predicted - observed| / observed TPOT, for the median
# No online calibration of the prediction: a factor per (pool, kind) pulled toward observed / predicted TPOT
# (in log space, 0.01-0.05 per request) raised the median error from 0.078-0.098 to 0.090-0.136 over three seeds
# of experiments/tpot_model_eval.py. Past saturation the errors of requests that overlap in time are one error
# (the batch they share), so the factor chased the last burst; as a step by observed / calibrated prediction it
# also integrated its own past and swung 0.5-2.0 (with ~100 requests predicted before the first settled).


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        v = body.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


class TpotRouter:
    """Per-pool models, per-(tenant, kind) output lengths, session → pool memory, and the comparison counts."""

    def __init__(self, cfg: GatewayConfig) -> None:
        s: TpotSettings = cfg.routing.tpot
        self.settings = s
        self.pools = {
            name: PoolModel(name, speculative=p.speculative, window=s.window, prior_streams=s.prior_streams)
            for name, p in cfg.pools.items()
        }
        self._sessions: OrderedDict[int, str] = OrderedDict()
        self._lengths: OrderedDict[tuple[str, str], Mean] = OrderedDict()
        self._kind_lengths: dict[str, Mean] = {}
        self.decisions: dict[tuple[str, str, str], int] = {}  # (pool, kind, outcome) -> requests
        # Per pool: predicted and observed TPOT seconds summed over the requests it decided, and their count.
        self.compared: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in cfg.pools}
        self.errors: dict[str, deque[float]] = {name: deque(maxlen=ERROR_WINDOW) for name in cfg.pools}
        # Read on every pick: plain attributes, and each (tenant, kind)'s expected length until the next one settles.
        self._need, self._keep = s.min_samples, 1.0 - s.hysteresis
        self._max_sessions = s.sessions
        self._stale_s = s.stale_s
        self._probed: dict[str, float] = {}  # pool -> scrape clock of the last request sent to it as a probe
        self._level: dict[tuple[str, str], float] = {}

    @classmethod
    def for_config(cls, cfg: GatewayConfig) -> TpotRouter | None:
        """A router when enabled and some model has pools of both roles; None otherwise."""
        if not cfg.routing.tpot.enabled:
            return None
        both = any(len({cfg.pools[p].role for p in m.pools}) == 2 for m in cfg.models)
        return cls(cfg) if both else None

    # -- pick -------------------------------------------------------------------------------------
    def choose(
        self, home: PoolState, home_candidates: Sequence[ReplicaState], other: PoolState,
        other_candidates: Sequence[ReplicaState], body: Mapping[str, Any], tenant: str, session: int,
        prompt_tokens: int,
    ) -> Prediction | None:
        """The pool that ends this interactive request first (home or other), or None when not engaged."""
        hm, om = self.pools[home.name], self.pools[other.name]
        hm.refresh(home.replicas)
        om.refresh(other.replicas)
        need = self._need
        if not (hm.ready(need) and om.ready(need)):
            return None
        kind = request_kind(body)
        n_out = self._output_tokens(tenant, kind, body)
        h_total, h_tpot = best_total(hm, home_candidates, hm.tokens_per_step(tenant, kind), n_out)
        o_total, o_tpot = best_total(om, other_candidates, om.tokens_per_step(tenant, kind), n_out)
        sessions = self._sessions
        prev = sessions.get(session) if self._max_sessions else None
        on_other = prev == other.name
        inc_total, ch_total = (o_total, h_total) if on_other else (h_total, o_total)
        challenger = hm if on_other else om
        margin = inc_total * self._keep
        lost = prompt_tokens * challenger.prefill_s_per_token if prev is not None else 0.0
        move = ch_total + lost < margin
        outcome = "moved" if move else ("affinity" if ch_total < margin else "kept")
        if move and not on_other:
            # Leaving the class's pool: if that pool has had no decode steps for a while, its fit is what it was
            # when traffic left it (a restart's warm-up, a burst that has passed) and nothing would ever correct
            # it. One request per `stale_s` goes there anyway, and its steps are the next scrape's new point.
            now = max(hm.clock, om.clock)
            if hm.stale(now, self._stale_s) and now - self._probed.get(home.name, -self._stale_s) >= self._stale_s:
                self._probed[home.name] = now
                move, outcome = False, "probe"
        to_other = on_other != move
        chosen, tpot = (other.name, o_tpot) if to_other else (home.name, h_tpot)
        if self._max_sessions and prev != chosen:
            sessions[session] = chosen
            if prev is None and len(sessions) > self._max_sessions:
                sessions.popitem(last=False)  # the first remembered (not refreshed: a forgotten one loses affinity)
        k = (chosen, kind, outcome)
        self.decisions[k] = self.decisions.get(k, 0) + 1
        return Prediction(chosen, kind, tpot, ((home.name, h_total), (other.name, o_total)), outcome)

    def _output_tokens(self, tenant: str, kind: str, body: Mapping[str, Any]) -> int:
        key = (tenant, kind)
        level = self._level.get(key)
        if level is None:
            default = float(self.settings.default_output_tokens)
            by_kind = self._kind_lengths.get(kind)
            level = by_kind.shrunk(default, 1.0) if by_kind is not None else default
            own = self._lengths.get(key)
            if own is not None:
                level = own.shrunk(level, self.settings.prior_streams)
            self._level[key] = level
        cap = _max_tokens(body)
        n = int(level + 0.5)
        return max(min(n, cap) if cap is not None else n, 1)

    # -- settle -----------------------------------------------------------------------------------
    def observe(self, ctx: RequestContext) -> None:
        """A finished request: its output length, its stream's tokens per step, predicted against observed TPOT."""
        route = ctx.route
        if route is None or ctx.status != 200 or ctx.route_class is None:
            return
        pred = route.prediction
        n = ctx.usage.completion_tokens
        model = self.pools.get(route.pool)
        streamed = ctx.stream and n > 1 and ctx.timing.first_token > 0 and ctx.migrations == 0
        if pred is None and not (
            ctx.route_class.route_class == "interactive" or (streamed and model is not None and model.speculative)
        ):
            return
        kind = pred.kind if pred is not None else request_kind(ctx.body)
        tenant = ctx.tenant_id
        if ctx.route_class.route_class == "interactive" and n > 0:
            self._learn_length(tenant, kind, n)
        if not streamed or model is None:
            return
        if model.speculative and ctx.stream_events > 1:
            model.acceptance.add_stream(tenant, kind, (n - 1) / (ctx.stream_events - 1), ctx.stream_events - 1)
        if pred is not None and pred.pool == route.pool:
            observed = (ctx.timing.end - ctx.timing.first_token) / (n - 1)
            if observed > 0 and pred.tpot_s > 0:
                row = self.compared[route.pool]
                row[0] += pred.tpot_s
                row[1] += observed
                row[2] += 1
                self.errors[route.pool].append(abs(pred.tpot_s - observed) / observed)

    def _learn_length(self, tenant: str, kind: str, n: int) -> None:
        self._level.clear()
        self._kind_lengths.setdefault(kind, Mean()).add(float(n))
        key = (tenant, kind)
        found = self._lengths.get(key)
        if found is None:
            if len(self._lengths) >= 4096:
                self._lengths.popitem(last=False)
            found = self._lengths[key] = Mean()
        else:
            self._lengths.move_to_end(key)
        found.add(float(n))

    def median_error(self, pool: str) -> float | None:
        """Median |predicted - observed| / observed TPOT over the pool's last decided requests."""
        errs = sorted(self.errors.get(pool, ()))
        return errs[len(errs) // 2] if errs else None
