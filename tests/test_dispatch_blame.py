"""The dispatcher's verdicts on poisoned requests: a body that fails the same way on two replicas is answered, not
sent on, and counts against no breaker; a caller that keeps failing is refused before any replica is picked."""

from __future__ import annotations

import orjson
import pytest

from app.config.failure_budget import FailureBudgetConfig
from app.dispatch import Complete
from app.errors import GatewayError, upstream_status
from tests.test_dispatch import A, B, FakeResponse, ctx, key, replica, setup

FAULT = b'{"error":{"message":"injected fault","type":"InternalServerError","code":500}}'


async def test_a_body_failing_the_same_way_on_two_replicas_is_answered_and_blames_neither() -> None:
    d, cluster, _ = setup({A: [upstream_status(A, 500, FAULT)], B: [upstream_status(B, 500, FAULT)]},
                          allow_spill=False)  # fmt: skip
    out = await d.run(ctx(), d.cfg.models[0], key())
    assert isinstance(out, Complete) and out.status == 500
    assert orjson.loads(out.body)["error"]["message"] == "injected fault"
    assert d.transport.sent == [A, B]  # not retried on every replica (retries: 2)
    for url in (A, B):
        r = replica(cluster, url)
        assert r.breaker._consecutive == 0 and r.in_flight == 0 and r.last_error is None


async def test_a_5xx_served_elsewhere_counts_against_the_replica_that_gave_it() -> None:
    d, cluster, _ = setup({A: [upstream_status(A, 500, FAULT)], B: [FakeResponse()]})
    out = await d.run(ctx(), d.cfg.models[0], key())
    assert isinstance(out, Complete) and out.status == 200
    assert replica(cluster, A).breaker._consecutive == 1 and replica(cluster, A).in_flight == 0


async def test_a_stream_the_engine_answers_in_json_is_relayed_whole_and_is_no_failure() -> None:
    d, cluster, _ = setup({A: [FakeResponse()]})
    out = await d.run(ctx(stream=True), d.cfg.models[0], key())
    assert isinstance(out, Complete) and out.status == 200
    assert replica(cluster, A).breaker._consecutive == 0 and replica(cluster, A).in_flight == 0


async def test_a_caller_past_its_failure_budget_is_refused_without_an_upstream_call() -> None:
    burst = 2
    script = {A: [upstream_status(A, 500, FAULT) for _ in range(burst)],
              B: [upstream_status(B, 500, FAULT) for _ in range(burst)]}  # fmt: skip
    budget = FailureBudgetConfig(client_burst=burst, refill_per_s=0.001)
    d, _, _ = setup(script, upstream={"failure_budget": budget})
    for _ in range(burst):
        c = ctx()
        c.client = "10.0.0.7"
        assert (await d.run(c, d.cfg.models[0], key())).status == 500
    sent = len(d.transport.sent)
    c = ctx()
    c.client = "10.0.0.7"
    with pytest.raises(GatewayError) as info:
        await d.run(c, d.cfg.models[0], key())
    assert info.value.status == 429 and info.value.code == "failure_budget_exceeded"
    assert len(d.transport.sent) == sent
