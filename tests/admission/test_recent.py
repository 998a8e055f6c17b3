"""Recent service per tenant: decays over the window, says who is below its weighted share, bounds banked credit."""

import math

import pytest

from app.admission.recent import RecentService


def unweighted(tenant: str) -> float:
    return 1.0


def test_a_tenants_level_decays_with_the_window() -> None:
    r = RecentService(10.0, unweighted)
    r.add("a", 1000, 0.0)
    assert r.level("a", 10.0) == pytest.approx(1000 * math.exp(-1))
    assert r.level("nobody", 10.0) == 0.0


def test_the_tenant_that_got_less_lately_is_below_its_share() -> None:
    r = RecentService(10.0, unweighted)
    r.add("light", 450, 0.0)
    r.add("heavy", 550, 0.0)
    assert r.below_share("light", ["light", "heavy"], 1.0)
    assert not r.below_share("heavy", ["light", "heavy"], 1.0)
    assert not r.below_share("light", ["light"], 1.0)  # alone: nobody to compare with


def test_weights_scale_the_share() -> None:
    r = RecentService(10.0, lambda t: 3.0 if t == "gold" else 1.0)
    r.add("gold", 700, 0.0)
    r.add("plain", 300, 0.0)
    assert r.below_share("gold", ["gold", "plain"], 0.0)  # 70% of the service, 75% of the weight


def test_a_newcomer_counts_as_at_least_half_its_share_so_its_catch_up_is_bounded() -> None:
    r = RecentService(10.0, unweighted)
    r.add("heavy", 10_000, 0.0)
    r.add("new", 100, 0.0, active=["heavy", "new"])
    assert r.level("new", 0.0) == pytest.approx(5_100)  # lifted to half of heavy's, then charged


def test_forget_drops_tenants_idle_for_many_windows() -> None:
    r = RecentService(1.0, unweighted)
    r.add("old", 100, 0.0)
    r.add("recent", 100, 9.0)
    r.forget(10.0)
    assert r.level("old", 10.0) == 0.0 and r.level("recent", 10.0) > 1.0
