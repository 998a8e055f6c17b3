"""An opt-in record of the engine's steps and of each request's way to its first token (`kvgate sim --step-trace`).

Per step: when it was scheduled (wall), when it was meant to start and how long the model says it lasts, when
it really ended, and what it held (new prefills, prompt tokens, decoding sequences, what was left waiting).
Per request: when the API server handed it over (`arrival`), when the engine queue got it (after the modeled
API-server overhead), the step that first scheduled it and the step that produced its first token. With it a
TTFT tail splits into "arrived late / in a burst" (the sender's doing) and "waited in the engine, in a step
shared with N other prefills" (the batch's), and the wall time of each step against its model (the host's).

Off by default: the engine then holds None and pays two `is not None` tests per step (and one per request
queued). Times are the engine's `time.monotonic()` seconds, wall clock; the snapshot names the time scale.
"""

from __future__ import annotations

from collections import deque
from typing import Any

MAX_STEPS = 500_000  # about an hour of a busy engine at time scale 1; older steps are dropped
MAX_REQUESTS = 200_000


class StepTrace:
    """Steps and per-request timestamps kept in memory; `snapshot` is what GET /sim/step_trace returns."""

    __slots__ = ("_open", "requests", "steps")

    def __init__(self) -> None:
        # (index, scheduled_at, start, modeled_s, ended_at, prefills, prefill_tokens, decodes, waiting)
        self.steps: deque[tuple[int, float, float, float, float, int, int, int, int]] = deque(maxlen=MAX_STEPS)
        self.requests: deque[dict[str, Any]] = deque(maxlen=MAX_REQUESTS)
        self._open: dict[int, dict[str, Any]] = {}  # id(SimRequest) -> its record until its first token

    def enqueued(self, req_id: int, rid: str, arrival: float, at: float, prompt_tokens: int) -> None:
        """A request reached the engine queue at `at` (it arrived at the API server at `arrival`)."""
        rec = {"rid": rid, "arrival": arrival, "enqueued": at, "prompt": prompt_tokens,
               "step": None, "scheduled": None, "cached": None, "first_step": None, "first_token": None}
        self._open[req_id] = rec
        self.requests.append(rec)

    def scheduled(self, req_id: int, step: int, at: float, cached_tokens: int) -> None:
        """The request's first scheduling (its prefill starts in `step`, `cached_tokens` of its prompt hit)."""
        rec = self._open.get(req_id)
        if rec is not None and rec["step"] is None:
            rec["step"], rec["scheduled"], rec["cached"] = step, at, cached_tokens

    def first_token(self, req_id: int, step: int, at: float) -> None:
        """The request's first token came out of `step` at `at`."""
        rec = self._open.pop(req_id, None)
        if rec is not None:
            rec["first_step"], rec["first_token"] = step, at

    def dropped(self, req_id: int) -> None:
        """The request ended (aborted) before its first token."""
        self._open.pop(req_id, None)

    def step(self, index: int, scheduled_at: float, start: float, modeled_s: float, ended_at: float,
             prefills: int, prefill_tokens: int, decodes: int, waiting: int) -> None:
        """One engine step (wall seconds except `modeled_s`, the profile's duration before the time scale)."""
        self.steps.append((index, scheduled_at, start, modeled_s, ended_at, prefills, prefill_tokens, decodes,
                           waiting))

    def snapshot(self, time_scale: float) -> dict[str, Any]:
        """Everything recorded, JSON-ready."""
        cols = ["index", "scheduled_at", "start", "modeled_s", "ended_at", "prefills", "prefill_tokens",
                "decodes", "waiting"]
        return {"time_scale": time_scale, "step_columns": cols, "steps": list(self.steps),
                "requests": list(self.requests)}
