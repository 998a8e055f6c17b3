import pytest

from app.routing.tpot.step_fit import StepFit


def _roofline(b: float) -> float:
    # flat while memory-bound, then 0.18 ms per sequence (a speculative pool with 4 drafts per sequence)
    return 7e-3 + 1.6e-5 * b + max(5 * b - 180, 0) * 3.6e-5


def test_no_points_predicts_nothing() -> None:
    assert StepFit().predict(8) is None


def test_the_fit_follows_a_roofline_within_5_percent_and_its_kink_within_10() -> None:
    fit = StepFit(window=128)
    for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 128, 160):
        fit.add(b, _roofline(b))
    for b in (3, 10, 20, 50, 70, 100, 150):
        assert fit.predict(b) == pytest.approx(_roofline(b), rel=0.05)
    assert fit.predict(36) == pytest.approx(_roofline(36), rel=0.10)


def test_beyond_the_data_it_extends_the_edge_slope_and_never_falls() -> None:
    fit = StepFit()
    for b in (10, 20, 30, 40):
        fit.add(b, 0.01 + 0.001 * b)
    assert fit.predict(80) == pytest.approx(0.09, rel=0.05)
    assert fit.predict(1) == pytest.approx(0.011, rel=0.1)
    noisy = StepFit()
    for b, y in ((10, 0.02), (20, 0.019), (30, 0.018)):
        noisy.add(b, y)
    assert noisy.predict(100) == pytest.approx(noisy.predict(30))  # slope clamped at 0: bigger is never faster


def test_old_points_leave_the_window() -> None:
    fit = StepFit(window=8)
    for _ in range(8):
        fit.add(16, 0.050)
    for _ in range(8):
        fit.add(16, 0.010)
    assert fit.predict(16) == pytest.approx(0.010)


def test_nonsense_points_are_ignored() -> None:
    fit = StepFit()
    fit.add(0, 0.01)
    fit.add(4, -1.0)
    fit.add(float("nan"), 0.01)
    assert len(fit) == 0
