"""The prefill gate: counted starts until their first token, each for a bounded time."""

from __future__ import annotations

from app.admission.prefill import PrefillGate


def test_the_gate_holds_once_full_and_opens_when_a_first_token_comes() -> None:
    gate = PrefillGate(hold_s=1.0)
    a, b = object(), object()
    gate.start(a, 10.0)
    assert gate.held_until(10.0, allowed=2) == 0.0
    gate.start(b, 10.1)
    assert gate.held_until(10.2, allowed=2) == 11.0  # the oldest stops counting 1 s after its start
    assert gate.done(a) and not gate.done(a)
    assert gate.held_until(10.2, allowed=2) == 0.0


def test_a_start_without_a_first_token_stops_counting_after_the_hold() -> None:
    gate = PrefillGate(hold_s=0.5)
    gate.start(object(), 10.0)
    assert gate.held_until(10.4, allowed=1) == 10.5
    assert gate.held_until(10.5, allowed=1) == 0.0 and len(gate) == 0
