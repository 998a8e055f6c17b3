"""The TPOT chooser inside pick(): engagement, the faster pool, hysteresis, session affinity, what settle teaches."""

from __future__ import annotations

from typing import Any

import pytest

from app.context import ClassDecision, RequestContext, RouteDecision, Tenant
from app.routing.pick import pick
from app.routing.state import ClusterState, ReplicaState
from app.routing.tpot.router import TpotRouter
from app.surfaces import CHAT
from tests.routing.factory import make_config

INTERACTIVE = ClassDecision("interactive", "stream")
F1, B1 = "http://127.0.0.1:9101", "http://127.0.0.1:9201"
CODE = {"messages": [{"role": "user", "content": "rename x\n```python\nx = 1\n```"}], "max_tokens": 200}
CHAT_BODY = {"messages": [{"role": "user", "content": "why is the sky blue?"}], "max_tokens": 200}


class Engine:
    """Counters one replica's /metrics would show, advanced interval by interval."""

    def __init__(self, replica: ReplicaState, speculative: bool, router: TpotRouter) -> None:
        self.replica = replica
        self.model = router.pools[replica.pool]
        self.c: dict[str, float] = {"vllm:inter_token_latency_seconds_sum": 0.0,
                                    "vllm:inter_token_latency_seconds_count": 0.0,
                                    "vllm:generation_tokens": 0.0, "vllm:prompt_tokens": 0.0}
        if speculative:
            self.c |= {"vllm:spec_decode_num_accepted_tokens": 0.0, "vllm:spec_decode_num_draft_tokens": 0.0,
                       "vllm:spec_decode_num_drafts": 0.0}
        self.t = 0.0

    def run(self, batch: int, step_s: float, accepted_per_step: float = 0.0, interval_s: float = 1.0) -> None:
        steps = interval_s / step_s
        self.c["vllm:inter_token_latency_seconds_sum"] += steps * batch * step_s
        self.c["vllm:inter_token_latency_seconds_count"] += steps * batch
        if "vllm:spec_decode_num_accepted_tokens" in self.c:
            self.c["vllm:spec_decode_num_accepted_tokens"] += steps * batch * accepted_per_step
            self.c["vllm:spec_decode_num_draft_tokens"] += steps * batch * 4
        self.t += interval_s
        self.replica.apply_metrics({"vllm:num_requests_running": batch, **self.c}, now=self.t)
        self.model.refresh([self.replica])  # what the next pick does (the router reads scrapes lazily)


def spec_step(b: float) -> float:
    return 7e-3 + 1.6e-5 * b + max(5 * b - 180, 0) * 3.6e-5


def bulk_step(b: float) -> float:
    return 6.5e-3 + 1.6e-5 * b + 4e-5 * b


def setup(**tpot: Any) -> tuple[Any, ClusterState, TpotRouter, Engine, Engine]:
    cfg = make_config(fast=[F1], bulk=[B1], routing={"tpot": tpot}, fast_extra={"speculative": True})
    cluster = ClusterState.from_config(cfg)
    router = TpotRouter.for_config(cfg)
    assert router is not None
    cluster.tpot = router
    fast, bulk = (Engine(cluster.pools[p].replicas[0], p == "fast", router) for p in ("fast", "bulk"))
    return cfg, cluster, router, fast, bulk


def warm(fast: Engine, bulk: Engine, spec_batches: tuple[int, ...], bulk_batch: int, accepted: float = 1.0) -> None:
    fast.run(1, spec_step(1), accepted)  # the first scrape only sets the baseline
    bulk.run(1, bulk_step(1))
    for b in spec_batches:
        fast.run(b, spec_step(b), accepted)
    for b in (bulk_batch - 10, bulk_batch, bulk_batch + 10):
        bulk.run(b, bulk_step(b))


def decide(cfg: Any, cluster: ClusterState, body: dict[str, Any], key: int = 7, prompt_tokens: int = 50
           ) -> RouteDecision:
    return pick(model=cfg.models[0], decision=INTERACTIVE, key=key, cluster=cluster, cfg=cfg.routing, body=body,
                tenant="t", prompt_tokens=prompt_tokens)


def test_without_scrapes_the_router_stays_out_and_class_decides() -> None:
    cfg, cluster, _, _, _ = setup()
    r = decide(cfg, cluster, CHAT_BODY)
    assert r.pool == "fast" and r.prediction is None and r.reason != "tpot"


def test_a_model_without_a_bulk_pool_gets_no_router() -> None:
    assert TpotRouter.for_config(make_config(fast=[F1], bulk=[])) is None
    assert TpotRouter.for_config(make_config(routing={"tpot": {"enabled": False}})) is None


def test_a_lightly_loaded_spec_pool_takes_interactive_requests_and_says_why() -> None:
    cfg, cluster, _, fast, bulk = setup()
    warm(fast, bulk, (2, 4, 8, 16), 100)
    r = decide(cfg, cluster, CHAT_BODY)
    assert (r.pool, r.reason) == ("fast", "round_robin")  # kept in its class's pool: the policy's reason stands
    assert r.prediction is not None and r.prediction.outcome == "kept"
    header = r.prediction.header()
    assert header.startswith(";fast=") and ";bulk=" in header and ";tpot=" in header and header.endswith("kind=prose")


def test_a_busy_spec_pool_sends_low_acceptance_chat_to_bulk_and_keeps_code() -> None:
    cfg, cluster, router, fast, bulk = setup()
    for b in (100, 100, 140, 180, 200):
        fast.run(b, spec_step(b), 1.0)
    for b in (140, 140, 150, 160):
        bulk.run(b, bulk_step(b))
    pool = router.pools["fast"].acceptance
    for _ in range(40):  # streams: code 3.6 tokens per step, chat 1.3 (the pool's counters say 2.0)
        pool.add_stream("t", "code", 3.6)
        pool.add_stream("t", "prose", 1.3)
    cluster.pools["fast"].replicas[0].external = 200
    cluster.pools["bulk"].replicas[0].external = 150
    chat = decide(cfg, cluster, CHAT_BODY, key=1)
    code = decide(cfg, cluster, CODE, key=2)
    assert (chat.pool, chat.reason, chat.spilled) == ("bulk", "tpot", True)
    assert chat.prediction is not None and chat.prediction.outcome == "moved"
    assert code.pool == "fast" and code.prediction is not None and code.prediction.kind == "code"


def test_hysteresis_keeps_a_request_home_when_the_other_pool_is_only_slightly_faster() -> None:
    cfg, cluster, _, fast, bulk = setup(hysteresis=0.5)
    for b in (100, 100, 140, 180, 200):
        fast.run(b, spec_step(b), 1.0)
    for b in (140, 140, 150, 160):
        bulk.run(b, bulk_step(b))
    cluster.pools["fast"].replicas[0].external = 200
    cluster.pools["bulk"].replicas[0].external = 150
    r = decide(cfg, cluster, CHAT_BODY)
    assert r.pool == "fast" and r.prediction is not None and r.prediction.outcome == "kept"


def test_a_session_on_the_spec_pool_stays_when_the_gain_is_less_than_the_prefill_it_would_lose() -> None:
    cfg, cluster, router, fast, bulk = setup()
    warm(fast, bulk, (2, 4, 8, 16), 100)
    first = decide(cfg, cluster, CHAT_BODY, key=42)
    assert first.pool == "fast"
    for b in (100, 140, 180, 200):  # the spec pool gets busy: chat would now be faster on bulk
        fast.run(b, spec_step(b), 0.3)
    cluster.pools["fast"].replicas[0].external = 200
    cluster.pools["bulk"].replicas[0].external = 100
    router.pools["bulk"].prefill_s_per_token = 1e-3  # a long history costs a second of prefill to move
    kept = decide(cfg, cluster, CHAT_BODY, key=42, prompt_tokens=20_000)
    assert kept.pool == "fast" and kept.prediction is not None and kept.prediction.outcome == "affinity"
    moved = decide(cfg, cluster, CHAT_BODY, key=42, prompt_tokens=100)
    assert moved.pool == "bulk" and moved.prediction is not None and moved.prediction.outcome == "moved"
    again = decide(cfg, cluster, CHAT_BODY, key=42, prompt_tokens=100)  # now on bulk: bulk is its incumbent
    assert again.pool == "bulk" and again.prediction is not None and again.prediction.outcome == "kept"


def test_settle_teaches_output_length_acceptance_and_the_prediction_error() -> None:
    cfg, cluster, router, fast, bulk = setup()
    warm(fast, bulk, (2, 4, 8, 16), 100)
    route = decide(cfg, cluster, CODE)
    assert route.prediction is not None
    ctx = RequestContext(request_id="r", surface=CHAT, path="/v1/chat/completions", body=CODE, model="m",
                         stream=True, client_wants_usage=True, headers={})
    ctx.tenant, ctx.route_class, ctx.route, ctx.status = Tenant("t"), INTERACTIVE, route, 200
    ctx.usage.completion_tokens, ctx.stream_events = 121, 31  # 4 tokens per step
    ctx.timing.first_token, ctx.timing.end = 10.0, 10.0 + 120 * route.prediction.tpot_s * 1.1
    router.observe(ctx)
    assert router.median_error("fast") == pytest.approx(0.1 / 1.1)
    assert router.compared["fast"][2] == 1
    assert router.pools["fast"].acceptance.streams.mean == pytest.approx(4.0)
    assert router._output_tokens("t", "code", {}) < 256  # one 121-token answer pulls the default down


def test_settled_requests_slower_than_predicted_count_as_error_and_do_not_shift_the_next_prediction() -> None:
    # No calibration factor: errors of requests that overlap are one error (the batch they shared), and a factor
    # fed by them chased the last burst (router.py). What they show is the median error, for /metrics.
    cfg, cluster, router, fast, bulk = setup()
    warm(fast, bulk, (2, 4, 8, 16), 100)
    first = decide(cfg, cluster, CODE)
    assert first.prediction is not None
    for _ in range(60):
        route = decide(cfg, cluster, CODE)
        assert route.prediction is not None
        ctx = RequestContext(request_id="r", surface=CHAT, path="/v1/chat/completions", body=CODE, model="m",
                             stream=True, client_wants_usage=True, headers={})
        ctx.tenant, ctx.route_class, ctx.route, ctx.status = Tenant("t"), INTERACTIVE, route, 200
        ctx.usage.completion_tokens, ctx.stream_events = 101, 51
        ctx.timing.first_token, ctx.timing.end = 1.0, 1.0 + 100 * first.prediction.tpot_s * 1.3  # 30 % slower
        router.observe(ctx)
    last = decide(cfg, cluster, CODE)
    assert last.prediction is not None
    # the streams taught 2 tokens per step (101 tokens, 51 events), as the counters did (accepted 1.0 per step)
    assert last.prediction.tpot_s == pytest.approx(first.prediction.tpot_s, rel=0.02)
    assert router.median_error("fast") == pytest.approx(0.3 / 1.3, rel=0.05)


def busy_fast_idle_bulk(fast: Engine, bulk: Engine, cluster: ClusterState) -> None:
    """Scrapes that make bulk the faster pool for chat: the spec pool is saturated, bulk nearly idle."""
    for b in (100, 100, 140, 180, 200):
        fast.run(b, spec_step(b), 0.3)
    for b in (140, 140, 150, 160):
        bulk.run(b, bulk_step(b))
    cluster.pools["fast"].replicas[0].external = 200
    cluster.pools["bulk"].replicas[0].external = 150


def test_a_class_pool_left_without_decode_steps_gets_one_probe_per_stale_interval() -> None:
    cfg, cluster, _, fast, bulk = setup(stale_s=10)
    busy_fast_idle_bulk(fast, bulk, cluster)
    assert decide(cfg, cluster, CHAT_BODY, key=1).pool == "bulk"  # fresh data: moved, no probe
    for _ in range(12):  # bulk keeps serving; fast decodes nothing, and its fit still says "saturated"
        bulk.run(150, bulk_step(150))
    routes = [decide(cfg, cluster, CHAT_BODY, key=k) for k in range(10, 14)]
    assert [(r.pool, r.prediction.outcome if r.prediction else None) for r in routes] == [
        ("fast", "probe"), ("bulk", "moved"), ("bulk", "moved"), ("bulk", "moved")]
    for _ in range(11):  # another stale interval: the next leaving request probes again
        bulk.run(150, bulk_step(150))
    again = decide(cfg, cluster, CHAT_BODY, key=20)
    assert again.pool == "fast" and again.prediction is not None and again.prediction.outcome == "probe"


def test_a_session_on_the_other_pool_is_not_probed_back() -> None:
    cfg, cluster, _, fast, bulk = setup(stale_s=10)
    busy_fast_idle_bulk(fast, bulk, cluster)
    assert decide(cfg, cluster, CHAT_BODY, key=5).pool == "bulk"
    for _ in range(12):
        bulk.run(150, bulk_step(150))
    r = decide(cfg, cluster, CHAT_BODY, key=5)  # its prefix is cached on bulk: it is not the one to probe with
    assert r.pool == "bulk" and r.prediction is not None and r.prediction.outcome == "kept"


def test_an_engine_restart_clears_its_pools_fit_and_the_router_stands_aside_until_new_intervals() -> None:
    cfg, cluster, router, fast, bulk = setup()
    busy_fast_idle_bulk(fast, bulk, cluster)
    assert decide(cfg, cluster, CHAT_BODY, key=1).reason == "tpot"
    fast.c = dict.fromkeys(fast.c, 0.0)  # the engine came back: its counters start again from zero
    fast.run(1, spec_step(1), 1.0)
    model = router.pools["fast"]
    assert len(model.fit) == 0 and not model.ready(cfg.routing.tpot.min_samples)
    r = decide(cfg, cluster, CHAT_BODY, key=2)
    assert (r.pool, r.prediction) == ("fast", None)
    for b in (1, 2, 2):
        fast.run(b, spec_step(b), 1.0)
    assert decide(cfg, cluster, CHAT_BODY, key=3).prediction is not None  # engaged again, on the new engine's data
