import pytest

from app.routing.tpot.acceptance import PoolAcceptance


def test_tokens_per_step_is_one_plus_accepted_per_decode_step_from_the_counters() -> None:
    a = PoolAcceptance()
    assert a.tokens_per_step() == 1.0 and a.rate() is None
    a.add_counters(accepted=150, steps=100, draft_tokens=400)
    assert a.tokens_per_step() == pytest.approx(2.5)
    assert a.rate() == pytest.approx(150 / 400)


def test_a_kind_that_accepts_more_than_the_pool_average_is_expected_to_run_faster() -> None:
    a = PoolAcceptance(prior_streams=2)
    a.add_counters(accepted=150, steps=100, draft_tokens=400)  # the pool: 2.5 tokens per step
    for _ in range(50):
        a.add_stream("t", "code", 3.6)
        a.add_stream("t", "prose", 1.4)
    assert a.expected("t", "code") == pytest.approx(2.5 * 3.6 / 2.5, rel=0.05)
    assert a.expected("t", "prose") == pytest.approx(2.5 * 1.4 / 2.5, rel=0.05)
    # a tenant never seen gets its kind's figure; an unknown kind the pool's
    assert a.expected("new", "code") == pytest.approx(a.expected("t", "code"), rel=0.02)
    assert a.expected("t", "tool") == pytest.approx(2.5)


def test_streams_that_coalesce_events_scale_away_against_the_counters() -> None:
    # Every stream reports twice the tokens per event (an API server merging outputs): the counters still say 2.5.
    a = PoolAcceptance(prior_streams=1)
    a.add_counters(accepted=150, steps=100, draft_tokens=400)
    for _ in range(40):
        a.add_stream("t", "code", 7.2)
        a.add_stream("t", "prose", 2.8)
    assert a.expected("t", "code") == pytest.approx(3.6, rel=0.06)


def test_a_tenant_with_few_streams_is_pulled_toward_its_kind() -> None:
    a = PoolAcceptance(prior_streams=8)
    a.add_counters(accepted=100, steps=100, draft_tokens=400)
    for _ in range(80):
        a.add_stream("many", "code", 3.0)
    a.add_stream("one", "code", 1.0)
    assert a.expected("many", "code") > a.expected("one", "code") > a.expected("many", "code") * 0.7


def test_keys_are_bounded() -> None:
    a = PoolAcceptance(max_keys=4)
    for i in range(10):
        a.add_stream(f"t{i}", "code", 2.0)
    assert len(a.by_key()) == 4


def test_when_a_kind_leaves_the_pool_the_others_estimate_follows_the_counters_not_the_old_streams() -> None:
    # Code yields 3.6 tokens per step over 70 steps, prose 1.4 over 90; then the prose moves to another pool.
    a = PoolAcceptance(prior_streams=2)
    for _ in range(20):
        a.add_counters(accepted=70 * 2.6 + 90 * 0.4, steps=160, draft_tokens=640)
        a.add_stream("t", "code", 3.6, 70)
        a.add_stream("t", "prose", 1.4, 90)
    assert a.expected("t", "code") == pytest.approx(3.6, rel=0.02)
    for _ in range(30):
        a.add_counters(accepted=70 * 2.6, steps=70, draft_tokens=280)
        a.add_stream("t", "code", 3.6, 70)
    # the counters read 3.6 within a few intervals; streams averaged over the last 200 would still hold the prose
    # and scale code up to 4.3
    assert a.expected("t", "code") == pytest.approx(3.6, rel=0.02)
