"""Child processes we start (kvgate serve / sim, Redis, Prometheus, peers): output to a log file, never to an unread
pipe, stopped by their own pid.

A pipe nobody reads fills at 64 KiB and then blocks the child's next write to it (a log line, the ready line) for
good, event loop included: the process then ignores SIGTERM's drain and looks hung. A file cannot fill, and a
failure can show what the child said.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from kvlab.net import wait_http

ROOT = Path(__file__).resolve().parent.parent
# kvgate's CLI with this interpreter (works in a checkout without the console script installed).
KVGATE = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())"]


def start_logged(argv: list[str], log: Path | None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `argv` in the checkout with stdout and stderr appended to `log` (discarded without one)."""
    if log is None:
        return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM (the drain), then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.terminate()
    _reap(proc, timeout_s)


def _reap(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait for a process sent SIGTERM; SIGKILL it after `timeout_s` (one SIGTERM only: a second one ends
    uvicorn's drain at once)."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def stop_all(procs: list[subprocess.Popen[bytes]], timeout_s: float = 10.0) -> None:
    """`stop` for several at once: every one is sent SIGTERM before any is waited for (their drains overlap)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        _reap(p, timeout_s)


def spawn(es: ExitStack, logs: Path, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """Start `argv` with its output in logs/<name>.log; `es` stops it (SIGTERM, then SIGKILL) when it unwinds."""
    proc = start_logged(argv, logs / f"{name}.log", {**os.environ})
    es.callback(stop, proc)
    return proc


def wait_ready(url: str, proc: subprocess.Popen[bytes], logs: Path, name: str, timeout_s: float = 60) -> None:
    """Return once `url` answers 200; raise with the tail of logs/<name>.log (spawn's) if `proc` exits or time runs
    out."""
    wait_http(url, timeout_s, proc, log=logs / f"{name}.log")


@dataclass
class Proc:
    """A child process we started, with its base URL and the argv to start it again."""

    name: str
    url: str
    argv: list[str]
    popen: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    env: dict[str, str] | None = None

    @property
    def pid(self) -> int:
        """The child's pid (taskset execs the command, so it is the command's pid too)."""
        assert self.popen is not None
        return self.popen.pid

    def start(self, ready_path: str = "/health", timeout_s: float = 30.0, *, any_status: bool = False) -> Proc:
        """Start (or restart) the process and wait until `ready_path` answers 200 (or anything, `any_status`)."""
        self.popen = start_logged(self.argv, self.log, self.env)
        wait_http(self.url + ready_path, timeout_s, self.popen, any_status=any_status, log=self.log)
        return self

    def kill(self) -> None:
        """SIGKILL: the crash case (no graceful drain)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.popen is not None:
            stop(self.popen)
