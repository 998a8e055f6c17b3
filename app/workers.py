"""`kvgate serve --workers N`: N gateway processes on one port, each a whole gateway (own lifespan, Gateway,
probes, upstream pool), behind a small supervisor.

Each worker binds its own listening socket with SO_REUSEPORT and the kernel spreads new connections over them
by a hash of the connection's addresses: no shared accept queue, no process handing sockets around, and a
worker that dies takes only its own connections with it (the supervisor starts another). What must agree across
workers is already shared or deterministic: limits, spend and keys live in the Store (which is why N > 1 needs
Redis), and routing is rendezvous hashing over the same replica URLs. /metrics answers for all workers at once
(app/telemetry/workers.py).

Signals: the supervisor forwards SIGTERM/SIGINT to every worker (they run in a process group of their own, so
a terminal's Ctrl-C reaches them once, through it), and each drains as a single `kvgate serve` does
(app/api/server.py); the supervisor waits up to `listen.drain_s` plus a margin, then kills what is left.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Protocol

from app.config import GatewayConfig, load_config
from app.config.models import workers_problem
from app.telemetry.workers import WorkerMetrics

# A worker that crashes more often than this within RESTART_WINDOW_S is not restarted again: the gateway stops.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
# Beyond listen.drain_s, for the workers' lifespans to flush spend and close exporters.
STOP_MARGIN_S = 10.0
_POLL_S = 0.5


@dataclass(slots=True)
class WorkerInfo:
    """Who a worker is among its siblings; handed to the single-process serve path."""

    index: int
    count: int
    directory: str
    started: Any = None  # a multiprocessing Event, set once this worker listens
    metrics: WorkerMetrics | None = field(default=None, repr=False)

    def attach(self, app: Any) -> None:
        """Make the app's /metrics answer for every worker (see app/telemetry/workers.py)."""
        telemetry = app.api.state.gateway.telemetry
        self.metrics = WorkerMetrics(self.index, self.count, self.directory, lambda: telemetry.render_own()[0])
        self.metrics.start()
        telemetry.gather = self.metrics.gather

    def on_listening(self) -> None:
        """The worker's socket listens and its lifespan ran."""
        if self.started is not None:
            self.started.set()


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port with SO_REUSEPORT (not listening yet)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class ServeApp(Protocol):
    """The single-process serve path a worker runs (app/cli.py's serve_app, handed in so this module does not
    import the CLI; a module-level function, so the spawned child unpickles it by name)."""

    def __call__(self, cfg: GatewayConfig, host: str, port: int, log_level: str, *, sock: socket.socket | None = None,
                 worker: WorkerInfo | None = None) -> int: ...  # fmt: skip


def _worker_main(serve: ServeApp, config_path: str | None, host: str, port: int, log_level: str,
                 info: WorkerInfo) -> None:  # fmt: skip
    """A worker process: its own process group, the parent watched, then the single-process serve path."""
    os.setpgid(0, 0)
    parent = os.getppid()
    threading.Thread(target=_watch_parent, args=(parent,), name="kvgate-parent-watch", daemon=True).start()
    cfg = load_config(config_path)
    sock = reuseport_socket(host, port)
    code = serve(cfg, host, port, log_level, sock=sock, worker=info)
    if info.metrics is not None:
        info.metrics.stop()
    sys.exit(code)


def _watch_parent(parent: int) -> None:
    # The supervisor was killed without forwarding a signal (SIGKILL, OOM): drain as on SIGTERM.
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


class Supervisor:
    """Starts the workers, restarts one that crashes, forwards the stop signal and waits for the drain."""

    def __init__(self, serve: ServeApp, cfg: GatewayConfig, config_path: str | None, host: str, port: int,
                 log_level: str, workers: int) -> None:  # fmt: skip
        self.serve = serve
        self.cfg = cfg
        self.config_path = config_path
        self.host = host
        self.port = port
        self.log_level = log_level
        self.count = workers
        self._ctx = multiprocessing.get_context("spawn")
        self._procs: dict[int, Any] = {}
        self._started: dict[int, Any] = {}
        self._restarts: list[float] = []
        self._stopping = False
        self.directory = ""

    def run(self) -> int:
        """Serve until a signal (0), or until a worker cannot start (its exit code) or keeps crashing (1)."""
        # A bound, non-listening socket holds the port (and resolves port 0) for the workers' lifetime; only
        # listening sockets receive connections, so it never takes one.
        reserve = reuseport_socket(self.host, self.port)
        self.port = reserve.getsockname()[1]
        self.directory = tempfile.mkdtemp(prefix="kvgate-workers-")
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for i in range(self.count):
                self._start(i)
            return self._supervise()
        finally:
            self._stop_all()
            for s, handler in previous.items():
                signal.signal(s, handler)
            reserve.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def _start(self, index: int) -> None:
        started = self._ctx.Event()
        info = WorkerInfo(index, self.count, self.directory, started)
        proc = self._ctx.Process(
            target=_worker_main, args=(self.serve, self.config_path, self.host, self.port, self.log_level, info),
            name=f"kvgate-worker-{index}",
        )  # fmt: skip
        proc.start()
        self._procs[index], self._started[index] = proc, started

    def _supervise(self) -> int:
        while not self._stopping:
            multiprocessing.connection.wait([p.sentinel for p in self._procs.values()], timeout=_POLL_S)
            for index, proc in list(self._procs.items()):
                if proc.exitcode is None or self._stopping:
                    continue
                if not self._started[index].is_set():
                    print(f"kvgate: worker {index} did not start (exit {proc.exitcode}); stopping", file=sys.stderr)
                    return int(proc.exitcode) or 3
                now = time.monotonic()
                self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
                if len(self._restarts) > MAX_RESTARTS:
                    print(f"kvgate: workers crashed {len(self._restarts)} times in {RESTART_WINDOW_S:g} s; stopping",
                          file=sys.stderr)  # fmt: skip
                    return 1
                print(f"kvgate: worker {index} exited ({proc.exitcode}); starting another", file=sys.stderr)
                self._start(index)
        return 0

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._stopping = True
        for proc in self._procs.values():
            if proc.exitcode is None and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)

    def _stop_all(self) -> None:
        alive = [p for p in self._procs.values() if p.exitcode is None]
        if alive and not self._stopping:  # a failure path: stop the others as a SIGTERM would
            self._on_signal(signal.SIGTERM, None)
        deadline = time.monotonic() + self.cfg.listen.drain_s + STOP_MARGIN_S
        for proc in alive:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in alive:
            if proc.exitcode is None:
                proc.kill()
                proc.join(5)


def serve_workers(serve: ServeApp, cfg: GatewayConfig, config_path: str | None, host: str, port: int,
                  log_level: str, workers: int) -> int:  # fmt: skip
    """Run `workers` gateway processes on host:port; exit 2 when the config cannot run that many."""
    problem = workers_problem(workers, cfg.store.url) if workers >= 1 else f"{workers}: give 1 or more"
    if problem is None and not hasattr(socket, "SO_REUSEPORT"):
        problem = "worker processes need SO_REUSEPORT, which this platform lacks; run one worker per process"
    if problem is not None:
        print(f"--workers: {problem}", file=sys.stderr)
        return 2
    return Supervisor(serve, cfg, config_path, host, port, log_level, workers).run()
