"""A redis-server process we own (the tests' throwaway Redis, the compose stack's store)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from kvlab.net import free_port


class RedisNotInstalled(RuntimeError):
    """No redis-server binary on PATH (tests skip; REDIS_URL names another server)."""


@dataclass
class RedisServer:
    """One redis-server process we own: can be stopped and started again on the same port and dir."""

    workdir: Path
    appendonly: bool = False
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """redis:// URL of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart) the server and wait until it answers PING."""
        if shutil.which("redis-server") is None:
            raise RedisNotInstalled("redis-server not installed and REDIS_URL not set")
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes" if self.appendonly else "no", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM: Redis fsyncs its AOF before exiting)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        self.proc = None
