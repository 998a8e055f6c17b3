"""Whose fault a failed attempt was: the replica's, or the request's own.

A replica that answers 5xx to a body another replica serves is failing; a body that gets the same 5xx from two
replicas is failing by itself (a poisoned request, an engine bug on that input): counting it against every
replica it visits lets one caller open every breaker. So a 5xx is held as a suspect until the next attempt
says which: an answer elsewhere → the suspect replica gets the failure; the same status and error from the next
replica → neither does, and the request is answered with that error instead of being sent on; a 4xx elsewhere
says the body is invalid → neither does either. Connect errors
and timeouts are the replica's at once. With no other replica to compare against, the 5xx counts (a lone
failing engine must still open its breaker); the failure budget (app/failure_budget.py) bounds what a caller
can spend that way.
"""

from __future__ import annotations

import re
from typing import Protocol

import orjson

from app.errors import FailureKind, GatewayError, UpstreamStatusError

_DIGITS = re.compile(rb"[0-9a-f]{6,}|[0-9]+")  # request ids, counts and timestamps differ between replicas


class Verdict(Protocol):
    """An attempt's hold on its replica (app/dispatch.Lease)."""

    def fail(self, kind: FailureKind) -> None:
        """The replica failed the attempt."""
        ...

    def release(self) -> None:
        """No verdict on the replica."""
        ...


def failure_signature(err: GatewayError) -> tuple[int, bytes] | None:
    """What must repeat for two 5xx answers to be the same failure: the status and the error's type and message
    (ids and numbers masked); None for a failure that is no answer (connect error, timeout)."""
    if not isinstance(err, UpstreamStatusError):
        return None
    detail = err.upstream_body
    try:
        doc = orjson.loads(detail)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        inner = doc.get("error", doc)
        if isinstance(inner, dict):
            detail = orjson.dumps([inner.get("type"), inner.get("message")])
    return err.upstream_status, _DIGITS.sub(b"#", detail[:1024])


class Attribution:
    """One request's attempts: holds a 5xx as a suspect until the next attempt tells whose fault it was."""

    __slots__ = ("_suspect",)

    def __init__(self) -> None:
        self._suspect: tuple[Verdict, tuple[int, bytes]] | None = None

    def failed(self, lease: Verdict, err: GatewayError) -> bool:
        """An attempt failed with `err`; True when it repeats the previous replica's 5xx: the body's fault (both
        leases end without a verdict; answer the error, try no further)."""
        signature = failure_signature(err)
        previous, self._suspect = self._suspect, None
        if previous is not None and signature is not None and previous[1] == signature:
            previous[0].release()
            lease.release()
            return True
        if previous is not None:
            previous[0].fail("status_5xx")
        if signature is None:
            lease.fail(err.failure or "connect")
        else:
            self._suspect = (lease, signature)
        return False

    def answered(self, status: int) -> None:
        """An attempt got an answer: a 5xx before a success was its replica's failure; before a 4xx (the body is
        invalid), nobody's."""
        if self._suspect is None:  # the usual case, no 5xx before: one test per answered attempt
            return
        if status < 400:
            self.exhausted()
        else:
            self.abandon()

    def exhausted(self) -> None:
        """No attempt left to compare with: a pending 5xx counts against its replica."""
        if self._suspect is not None:
            self._suspect[0].fail("status_5xx")
            self._suspect = None

    def abandon(self) -> None:
        """The request ended otherwise (cancelled): a pending suspect gets no verdict."""
        if self._suspect is not None:
            self._suspect[0].release()
            self._suspect = None
