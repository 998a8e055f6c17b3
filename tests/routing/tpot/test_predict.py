import pytest

from app.routing.state import ReplicaState
from app.routing.tpot.pool_model import BatchLevel, PoolModel
from app.routing.tpot.predict import best_total, expected_batch


def test_a_batch_above_its_level_is_expected_to_revert_over_the_requests_life() -> None:
    # 60 sequences now, 40 lately, sequences live 2 s: a 2 s request shares 1 + 40 + 20 (1 - 1/e) on average
    assert expected_batch(60, 40.0, 2.0, 2.0, 0) == int(1.5 + 40 + 20 * 0.632)
    assert expected_batch(60, 40.0, 2.0, 0.001, 0) == 61  # a short request sees the batch as it is
    assert expected_batch(60, 40.0, 2.0, 200.0, 0) == 41  # a long one the level
    assert expected_batch(10, 40.0, 2.0, 2.0, 0) > 11  # below the level it is expected to rise
    assert expected_batch(300, 280.0, 2.0, 2.0, 256) == 256  # never past max_num_seqs


def test_best_total_prices_the_reverted_batch_once_the_lifetime_is_known() -> None:
    model = PoolModel("p", speculative=False, window=96, prior_streams=8)
    for b in range(10, 100, 10):
        model.fit.add(b, 0.005 + 1e-4 * b)
    r = ReplicaState("http://r")
    r.in_flight = 79
    now = best_total(model, [r], 1.0, 101)
    assert now[1] == pytest.approx(0.005 + 1e-4 * 80)
    level = model.levels[r.url] = BatchLevel(40.0)
    level.add(1.0, 40.0, seq_s=40.0, started=40.0)  # 40 decode seconds over 40 sequences: 1 s each
    reverted = best_total(model, [r], 1.0, 101)
    assert 0.005 + 1e-4 * 41 < reverted[1] < now[1]


def test_the_lifetime_is_decode_seconds_over_sequences_started_and_the_level_follows_the_batch() -> None:
    level = BatchLevel(0.0)
    for _ in range(40):
        level.add(1.0, 30.0, seq_s=30.0, started=15.0)  # 30 sequences decoding, 15 starting per second
    assert level.lifetime_s == pytest.approx(2.0)  # Little: 30 / 15
    assert level.level == pytest.approx(30.0, rel=0.01)
