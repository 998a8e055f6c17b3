"""Acceptance that depends on the request: the workload knob `--spec-accept-when MARKER=ACCEPT`.

An ngram proposer drafts from the prompt, so its drafts are accepted when the output repeats the prompt (a code
edit returns most of the code it was given, tool-call arguments quote the context) and rarely for free prose. The
sim cannot know what its random output copies, so the workload says it: a request whose body contains MARKER
(bytes, e.g. a code fence) has its draft tokens accepted with probability ACCEPT each; the first rule that matches
wins, and a request no rule matches uses `--speculative`'s ACCEPT. A substring test on the raw body costs ~1 µs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AcceptRules:
    """Ordered (marker, acceptance) rules."""

    rules: tuple[tuple[bytes, float], ...] = ()

    @classmethod
    def parse(cls, items: Sequence[str]) -> AcceptRules:
        """`MARKER=ACCEPT` items (ACCEPT in 0..1; the marker may hold '=' itself: the last one splits)."""
        rules = []
        for item in items:
            marker, sep, value = item.rpartition("=")
            try:
                accept = float(value)
            except ValueError:
                accept = -1.0
            if not sep or not marker or not 0.0 <= accept <= 1.0:
                raise ValueError(f"--spec-accept-when expects MARKER=ACCEPT with ACCEPT in 0..1, got {item!r}")
            rules.append((marker.encode(), accept))
        return cls(tuple(rules))

    def for_body(self, raw: bytes) -> float:
        """The acceptance of a request with this body; -1 when no rule matches (the engine's default applies)."""
        for marker, accept in self.rules:
            if marker in raw:
                return accept
        return -1.0
