"""Speculation that depends on the request (--spec-accept-when) and verification priced on a roofline."""

from __future__ import annotations

import pytest

from app.sim.kv_cache import BlockPool
from app.sim.profiles import CPU_SMOLLM2, H100_8B, Profile, StepCost
from app.sim.request import SimRequest
from app.sim.scheduler import Scheduler, SchedulerConfig
from app.sim.spec_accept import AcceptRules


def test_the_first_rule_whose_marker_is_in_the_body_gives_the_acceptance() -> None:
    rules = AcceptRules.parse(["```=0.85", "tools=0.7", "a=b=0.1"])
    assert rules.for_body(b'{"content":"```python\\nx```","tools":[]}') == 0.85
    assert rules.for_body(b'{"tools":[]}') == 0.7
    assert rules.for_body(b'{"x":"a=b"}') == 0.1  # the last '=' splits
    assert rules.for_body(b'{"content":"hello"}') == -1.0


@pytest.mark.parametrize("bad", ["0.5", "```=", "```=1.5", "=0.3", "```=x"])
def test_malformed_rules_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="MARKER=ACCEPT"):
        AcceptRules.parse([bad])


def _accepted_per_draft(accept: float) -> float:
    s = Scheduler(SchedulerConfig(num_spec_tokens=4, spec_accept=0.3), BlockPool(800), seed=3)
    for i in range(8):
        s.add(SimRequest(f"r{i}", list(range(40)), max_tokens=200, accept=accept))
    while s.has_work():
        s.finish_step(s.schedule(0.0), lambda r, k: 1000 + k, 0.0)
    return s.counters.spec_accepted / s.counters.spec_drafts


def test_a_request_s_own_acceptance_overrides_the_engine_s() -> None:
    high, default = _accepted_per_draft(0.85), _accepted_per_draft(-1.0)
    # E[accepted of 4] = sum p^i: 2.71 at 0.85, 0.42 at 0.3
    assert high == pytest.approx(2.71, rel=0.1)
    assert default == pytest.approx(0.42, rel=0.2)


def _step(profile: Profile, batch: int, drafts_per_seq: int) -> float:
    cost = StepCost(prefill_tokens=0, decode_seqs=batch, kv_tokens=batch * 500, draft_tokens=batch * drafts_per_seq)
    return profile.step_time(cost)


def test_on_a_gpu_verifying_drafts_is_nearly_free_at_batch_1_and_costs_compute_at_large_batches() -> None:
    small = _step(H100_8B, 1, 4) / _step(H100_8B, 1, 0)
    large = _step(H100_8B, 256, 4) / _step(H100_8B, 256, 0)
    assert small < 1.1  # memory-bound: the weights read covers the draft rows
    assert large > 2.5  # compute-bound: 1024 draft rows at a prefill token's compute each
    mid = _step(H100_8B, 64, 4) - _step(H100_8B, 64, 0)
    assert mid == pytest.approx(3e-4 + 256 * 2e-6 + (320 - 180.55) * 3.6e-5, rel=0.01)


def test_the_cpu_profile_keeps_its_linear_draft_cost() -> None:
    extra = _step(CPU_SMOLLM2, 8, 3) - _step(CPU_SMOLLM2, 8, 0)
    assert extra == pytest.approx(CPU_SMOLLM2.spec_step_s + 24 * CPU_SMOLLM2.draft_token_s)
