"""One /metrics for every worker process of a `kvgate serve --workers N`.

The kernel hands each connection to one worker (SO_REUSEPORT), so a scrape lands on any of them. Each worker
therefore serves its own exposition on a Unix socket in the supervisor's runtime folder, and the worker that
answers /metrics gathers all of them: every series gets a `worker` label ("0".."N-1") and each metric family
is written once with the samples of every worker, so any scrape sees the whole set. The dashboards sum over
`worker` (and `instance`) like over gateway replicas; a worker restarted by the supervisor starts its counters
at zero under the same label, which rate() reads as a counter reset.

Prometheus' multiprocess mode (prometheus_client's mmap files) is not used: the gateway's metrics are
OpenTelemetry instruments, which that mode cannot hold.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# A peer that does not answer within this is left out of this scrape (it is starting, or stuck).
PEER_TIMEOUT_S = 2.0
LABEL = "worker"
_NAME_END = frozenset(" {\t")


def socket_path(directory: str | os.PathLike[str], index: int) -> Path:
    """Where worker `index` serves its own exposition."""
    return Path(directory) / f"worker-{index}.sock"


def add_label(text: bytes, name: str, value: str) -> list[bytes]:
    """Every sample line of an exposition with `name="value"` as its first label; comments unchanged."""
    label = f'{name}="{value}"'.encode()
    out = []
    for line in text.splitlines():
        if not line or line.startswith(b"#"):
            out.append(line)
            continue
        # A metric name is [a-zA-Z_:][a-zA-Z0-9_:]*: the first byte outside that opens the labels or the value.
        cut = next((i for i, b in enumerate(line) if chr(b) in _NAME_END), len(line))
        if cut < len(line) and line[cut : cut + 1] == b"{":
            rest = line[cut + 1 :]
            out.append(line[: cut + 1] + label + (b"," if not rest.startswith(b"}") else b"") + rest)
        else:
            out.append(line[:cut] + b"{" + label + b"}" + line[cut:])
    return out


def merge(expositions: Iterable[tuple[str, bytes]]) -> bytes:
    """One exposition from several workers' (index, text): HELP/TYPE once per family, every worker's samples
    under it, each labelled with its worker."""
    order: list[bytes] = []
    headers: dict[bytes, list[bytes]] = {}
    samples: dict[bytes, list[bytes]] = {}
    for index, text in expositions:
        family = b""
        for line in add_label(text, LABEL, index):
            if line.startswith((b"# HELP ", b"# TYPE ")):
                family = line.split(b" ", 3)[2]
                if family not in headers:
                    order.append(family)
                    headers[family], samples[family] = [], []
                if line not in headers[family]:
                    headers[family].append(line)
            elif line and not line.startswith(b"#"):
                if family not in samples:  # samples before any HELP/TYPE: a family of their own
                    order.append(family)
                    headers[family], samples[family] = [], []
                samples[family].append(line)
    out = [line for fam in order for line in (*headers[fam], *samples[fam])]
    return b"\n".join(out) + b"\n" if out else b""


class _Handler(socketserver.BaseRequestHandler):
    server: _OwnServer

    def handle(self) -> None:
        with contextlib.suppress(OSError):  # the gathering worker gave up on us
            self.request.sendall(self.server.render_own())


class _OwnServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, render_own: Callable[[], bytes]) -> None:
        self.render_own = render_own
        super().__init__(path, _Handler)


@dataclass(slots=True)
class WorkerMetrics:
    """This worker's exposition server and the gathering of its peers' (see the module doc)."""

    index: int
    count: int
    directory: str
    render_own: Callable[[], bytes]
    timeout_s: float = PEER_TIMEOUT_S
    _server: _OwnServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> None:
        """Serve this worker's own exposition on its socket (a daemon thread; rendering is thread-safe)."""
        path = socket_path(self.directory, self.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a crashed predecessor's socket
        self._server = _OwnServer(str(path), self.render_own)
        self._thread = threading.Thread(target=self._server.serve_forever, name="kvgate-worker-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and remove the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            socket_path(self.directory, self.index).unlink()

    def gather(self, own: bytes) -> bytes:
        """Every worker's exposition, merged; blocking (peers answer over Unix sockets): call it off the loop."""
        parts = [(str(self.index), own)]
        for i in range(self.count):
            if i == self.index:
                continue
            text = self._fetch(i)
            if text is not None:
                parts.append((str(i), text))
        parts.sort(key=lambda p: int(p[0]))
        return merge(parts)

    def _fetch(self, index: int) -> bytes | None:
        chunks = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout_s)
                s.connect(str(socket_path(self.directory, index)))
                while chunk := s.recv(1 << 16):
                    chunks.append(chunk)
        except OSError as err:
            log.debug("worker %d's metrics not gathered: %s", index, err)
            return None
        return b"".join(chunks)
