"""One attempt's hold on a replica: in-flight counts and the circuit breaker see exactly one start and one
verdict per attempt, whichever way the attempt ends (the dispatcher takes it, the stream relay ends it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.errors import FailureKind
    from app.routing.state import ReplicaState


class Lease:
    """One attempt's hold on a replica: `on_start` now, then exactly one of success, failure or release."""

    __slots__ = ("_open", "replica")

    def __init__(self, replica: ReplicaState) -> None:
        self.replica = replica
        self._open = True
        replica.on_start()

    def succeed(self) -> None:
        """The replica answered (any status that is not its fault)."""
        if self._open:
            self._open = False
            self.replica.on_success()

    def fail(self, kind: FailureKind) -> None:
        """The replica failed the attempt."""
        if self._open:
            self._open = False
            self.replica.on_failure(kind)

    def release(self) -> None:
        """The attempt ended with no verdict on the replica (the client left, the task was cancelled)."""
        if self._open:
            self._open = False
            self.replica.on_release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
