"""Whose fault a failed attempt was: the same 5xx from two replicas is the body's, anything else the replica's."""

from __future__ import annotations

from app.attribution import Attribution, failure_signature
from app.errors import FailureKind, upstream_status, upstream_timeout, upstream_unreachable

A, B = "http://a:8000", "http://b:8000"
FAULT = b'{"error":{"message":"boom in request 7f3a9c01d2","type":"InternalServerError","code":500}}'
OTHER = b'{"error":{"message":"EngineCore died","type":"EngineDeadError","code":500}}'


class Held:
    """A lease that records its verdict."""

    def __init__(self) -> None:
        self.verdict: str | None = None

    def fail(self, kind: FailureKind) -> None:
        self.verdict = f"fail:{kind}"

    def release(self) -> None:
        self.verdict = "release"


def test_the_same_5xx_on_a_second_replica_is_the_body_and_neither_replica_is_blamed() -> None:
    blame, first, second = Attribution(), Held(), Held()
    assert not blame.failed(first, upstream_status(A, 500, FAULT))
    assert first.verdict is None  # a suspect until the next attempt says whose fault it was
    assert blame.failed(second, upstream_status(B, 500, FAULT.replace(b"7f3a9c01d2", b"0badc0ffee")))
    assert (first.verdict, second.verdict) == ("release", "release")


def test_a_5xx_then_an_answer_elsewhere_counts_against_the_first_replica() -> None:
    blame, first = Attribution(), Held()
    blame.failed(first, upstream_status(A, 500, FAULT))
    blame.answered(200)
    assert first.verdict == "fail:status_5xx"


def test_a_5xx_then_a_4xx_elsewhere_blames_nobody() -> None:
    blame, first = Attribution(), Held()
    blame.failed(first, upstream_status(A, 500, FAULT))
    blame.answered(400)
    assert first.verdict == "release"


def test_different_5xx_answers_are_both_the_replicas() -> None:
    blame, first, second = Attribution(), Held(), Held()
    blame.failed(first, upstream_status(A, 500, FAULT))
    assert not blame.failed(second, upstream_status(B, 500, OTHER))
    assert first.verdict == "fail:status_5xx" and second.verdict is None
    blame.exhausted()
    assert second.verdict == "fail:status_5xx"


def test_connect_errors_and_timeouts_are_the_replicas_at_once() -> None:
    blame, first, second = Attribution(), Held(), Held()
    assert not blame.failed(first, upstream_unreachable("refused"))
    assert not blame.failed(second, upstream_timeout("t"))
    assert (first.verdict, second.verdict) == ("fail:connect", "fail:timeout")
    assert failure_signature(upstream_timeout("t")) is None


def test_a_5xx_with_no_replica_left_to_compare_counts_and_a_cancelled_one_does_not() -> None:
    blame, only = Attribution(), Held()
    blame.failed(only, upstream_status(A, 503, b"overloaded"))
    blame.exhausted()
    assert only.verdict == "fail:status_5xx"
    blame, gone = Attribution(), Held()
    blame.failed(gone, upstream_status(A, 503, b"overloaded"))
    blame.abandon()
    assert gone.verdict == "release"
