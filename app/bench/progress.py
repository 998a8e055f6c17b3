"""A live progress bar on stderr (rich), or nothing when disabled."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from app.bench.spec import RequestRecord


class ProgressView:
    """Counts finished requests, errors and output tokens/s; bar by request count, else by elapsed time."""

    def __init__(self, label: str, total_requests: int | None, duration_s: float | None, *, enabled: bool) -> None:
        self.label = label
        self.total_requests = total_requests
        self.duration_s = duration_s
        self.enabled = enabled
        self.done = 0
        self.errors = 0
        self.tokens = 0
        self._t0 = time.perf_counter()
        self._last_refresh = 0.0
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> ProgressView:
        self._t0 = time.perf_counter()
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(), console=Console(stderr=True), transient=False,
            )
            total = self.total_requests if self.total_requests is not None else self.duration_s
            self._task = self._progress.add_task(self.label, total=total, stats="")
            self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._refresh(force=True)
            self._progress.stop()

    def update(self, rec: RequestRecord) -> None:
        """Count one finished request."""
        self.done += 1
        self.errors += 0 if rec.ok else 1
        self.tokens += rec.output_tokens
        if self._progress is not None:
            self._refresh(force=False)

    def _refresh(self, *, force: bool) -> None:
        assert self._progress is not None and self._task is not None
        now = time.perf_counter()
        # Throttled: with hundreds of streams finishing, re-rendering on each one would cost real CPU.
        if not force and now - self._last_refresh < 0.1:
            return
        self._last_refresh = now
        elapsed = max(now - self._t0, 1e-9)
        completed = self.done if self.total_requests is not None else min(elapsed, self.duration_s or elapsed)
        stats = f"{self.done} done, {self.errors} err, {self.tokens / elapsed:,.0f} tok/s"
        self._progress.update(self._task, completed=completed, stats=stats)
