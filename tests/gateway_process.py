"""`kvgate serve` as a child process for end-to-end tests: its output goes to files, never to pipes.

A pipe nobody reads fills at 64 KiB and then blocks the gateway's next write to it (a log line, the ready
line) for good, event loop included: the process then ignores SIGTERM's drain and looks hung. Files cannot
fill, and a test that fails can show what the gateway said.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

KVGATE = str(Path(sys.executable).parent / "kvgate")


@dataclass
class GatewayProcess:
    """One `kvgate serve` child, its stdout and stderr in `<log>.out` / `<log>.err`."""

    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, args: list[str], log: Path) -> GatewayProcess:
        """Run `kvgate <args>` with its output in files next to `log`."""
        with open(log.with_suffix(".out"), "wb") as out, open(log.with_suffix(".err"), "wb") as err:
            # faulthandler: a SIGABRT (see `wait`) writes every thread's Python stack to stderr first.
            env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
            proc = subprocess.Popen([KVGATE, *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        return cls(proc, log)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def output(self, limit: int = 4000) -> str:
        """The last `limit` characters the gateway wrote to stderr (its logs), then to stdout."""
        text = []
        for suffix in (".err", ".out"):
            path = self.log.with_suffix(suffix)
            if path.exists():
                text.append(f"--- {suffix[1:]}:\n{path.read_text(errors='replace')[-limit:]}")
        return "\n".join(text)

    def wait_ready(self, url: str, timeout: float = 60) -> None:
        """Return once `url`/ready answers 200; raise with the gateway's output if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited ({self.proc.returncode}):\n{self.output()}")
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway not ready in {timeout:g} s:\n{self.output()}")

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

    def stop(self, timeout: float) -> int:
        """SIGTERM (the drain), then `wait`."""
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.wait(timeout)
