"""`kvgate serve` as a child process for end-to-end tests: its output goes to a file, never to a pipe (why:
kvlab/procs.py), and a hung one shows its stacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvlab.net import log_tail
from kvlab.procs import start_logged, wait_ready

KVGATE = str(Path(sys.executable).parent / "kvgate")


@dataclass
class GatewayProcess:
    """One `kvgate serve` child, its stdout and stderr in `log` (a `<name>.log`, as kvlab.procs.spawn keeps)."""

    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, args: list[str], log: Path) -> GatewayProcess:
        """Run `kvgate <args>` with its output in `log`."""
        # faulthandler: a SIGABRT (see `wait`) writes every thread's Python stack to stderr first.
        return cls(start_logged([KVGATE, *args], log, {**os.environ, "PYTHONFAULTHANDLER": "1"}), log)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def output(self, limit: int = 4000) -> str:
        """The last `limit` characters the gateway wrote."""
        return log_tail(self.log, limit)

    def wait_ready(self, url: str, timeout: float = 60) -> None:
        """Return once `url`/ready answers 200; raise with the gateway's output if it exits or times out."""
        wait_ready(f"{url}/ready", self.proc, self.log.parent, self.log.stem, timeout)

    def wait(self, timeout: float) -> int:
        """The exit code once the process ends; past `timeout` it is killed and the failure shows its output."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # the stacks of a hung process, then its end
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            raise AssertionError(f"gateway {self.pid} still running {timeout:g} s on:\n{self.output()}") from None
