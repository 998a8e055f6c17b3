"""Loopback ports and HTTP readiness."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(log: Path | None, limit: int = 3000) -> str:
    """The last `limit` characters of a child's log ("" without one)."""
    return log.read_text(errors="replace")[-limit:] if log is not None and log.exists() else ""


def wait_http(
    url: str,
    timeout_s: float = 30.0,
    proc: subprocess.Popen[bytes] | None = None,
    *,
    any_status: bool = False,
    log: Path | None = None,
) -> None:
    """Poll `url` until it answers 200 (any status with `any_status`); raise after `timeout_s` or if `proc` exited,
    with the tail of its `log`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}:\n{log_tail(log)}")
        try:
            status = httpx.get(url, timeout=2.0).status_code
            if status == 200 or any_status:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s:\n{log_tail(log)}")


def never_reader(port: int, api_key: str, body: bytes, path: str = "/v1/chat/completions") -> socket.socket:
    """A client that POSTs `body` on a raw socket with a 4 KiB receive buffer and never reads the reply: what the
    gateway's write deadline must cut. The caller keeps the socket open (and closes it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n".encode()
                 + b"authorization: Bearer " + api_key.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    return sock
