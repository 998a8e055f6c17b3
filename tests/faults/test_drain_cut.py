"""A stream still running when listen.drain_s runs out ends properly: the surface's error event (code
shutting_down), then the chunked body's end — not a truncated body. Chat and Messages, as `kvgate serve` runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from app.sim.testing import running_sim
from tests.conftest import PUBLIC_MODEL
from tests.servers import free_port

pytestmark = pytest.mark.slow

DRAIN_S = 2.0
TOKENS = 2000  # cpu-smollm2 decodes ~70 ms a token: far longer than the drain


def config(sim: str, port: int) -> dict[str, object]:
    return {
        "listen": {"host": "127.0.0.1", "port": port, "drain_s": DRAIN_S, "drain_notice_s": 0.2},
        "models": [{"name": PUBLIC_MODEL, "pools": ["main"]}],
        "pools": {"main": {"role": "interactive", "served_model": "served-model", "replicas": [sim],
                           "price": {"input_per_m": 1.0, "output_per_m": 2.0}}},
        "auth": {"required": False},
        "routing": {"probe_interval_s": 0.2, "healthy_after": 1, "unhealthy_after": 1},
    }  # fmt: skip


def test_streams_cut_at_the_end_of_the_drain_end_with_an_error_event(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_sim(model="served-model", profile="cpu-smollm2") as sim:
        path = tmp_path / "kvgate.yaml"
        path.write_text(json.dumps(config(sim, port)))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--config", str(path)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        lines: dict[str, list[str]] = {"chat": [], "messages": []}
        errors: list[str] = []
        started = threading.Barrier(3)
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 30
            while b"kvgate ready on" not in proc.stdout.readline():
                assert time.monotonic() < deadline and proc.poll() is None, "kvgate serve did not start"

            def stream(api: str) -> None:
                msgs = [{"role": "user", "content": "count to a million"}]
                body = {"model": PUBLIC_MODEL, "messages": msgs, "stream": True, "max_tokens": TOKENS,
                        "ignore_eos": True}  # fmt: skip
                url = base + ("/v1/chat/completions" if api == "chat" else "/v1/messages")
                try:
                    with httpx.stream("POST", url, json=body, timeout=30) as r:
                        for line in r.iter_lines():  # raises on a truncated chunked body
                            lines[api].append(line)
                            if len(lines[api]) == 3:
                                started.wait(15)
                except httpx.HTTPError as err:
                    errors.append(f"{api}: {err!r}")

            readers = [threading.Thread(target=stream, args=(api,)) for api in lines]
            for t in readers:
                t.start()
            started.wait(15)
            proc.send_signal(signal.SIGTERM)
            for t in readers:
                t.join(timeout=DRAIN_S + 20)
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert errors == []
    chat = [line[6:] for line in lines["chat"] if line.startswith("data: ")]
    assert chat[-1] == "[DONE]" and orjson.loads(chat[-2])["error"]["code"] == "shutting_down"
    events = [line for line in lines["messages"] if line.startswith("event: ")]
    data = [line[6:] for line in lines["messages"] if line.startswith("data: ")]
    assert events[-1] == "event: error" and orjson.loads(data[-1])["error"]["type"] == "overloaded_error"
