"""The CLI's own behaviour: the ready line `kvgate serve` prints (only once every model has a healthy replica), and
lab commands without their extra."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import cli
from app.config import load_config
from kvlab.procs import stop
from tests.servers import free_port


def _replica(probed: bool, healthy: bool) -> SimpleNamespace:
    return SimpleNamespace(probed=probed, available=lambda: healthy)


def test_ready_line_counts_healthy_replicas_per_pool_after_the_first_probe() -> None:
    cfg = load_config()
    line = cli.ready_line(
        "http://127.0.0.1:8080", cfg, [("fast", _replica(True, True)), ("bulk", _replica(True, False))]
    )
    assert (
        line == "kvgate ready on http://127.0.0.1:8080 - pools fast (1/1 replica healthy), bulk (0/1 replica healthy)"
    )


def test_ready_line_says_which_replicas_were_not_probed_yet() -> None:
    cfg = load_config()
    line = cli.ready_line("http://h:1", cfg, [("fast", _replica(False, True)), ("bulk", _replica(True, True))])
    assert "fast (0/1 replica healthy, 1 not probed yet)" in line and "bulk (1/1 replica healthy)" in line


def test_ready_line_falls_back_to_configured_counts_without_gateway_state() -> None:
    cfg = load_config()
    assert (
        cli.ready_line("http://h:1", cfg, []) == "kvgate ready on http://h:1 - pools fast (1 replica), bulk (1 replica)"
    )


def test_missing_extra_reads_kvgate_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    requires = ['rich>=13; extra == "bench"', 'no-such-dist-kvgate>=1; extra == "bench"', "orjson>=3"]
    monkeypatch.setattr(cli.importlib.metadata, "requires", lambda name: requires)
    assert cli.missing_extra("bench") == ["no-such-dist-kvgate"]
    assert cli.missing_extra("sim") == []


def test_lab_command_without_its_extra_exits_2_before_parsing_its_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "missing_extra", lambda extra: ["tokenizers"] if extra == "sim" else [])
    assert cli.main(["sim", "--port", "1", "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'kvgate[sim]'" in err and "tokenizers" in err


def _line(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("kvgate "):
            return line
        assert line or proc.poll() is None, "kvgate serve exited"
    raise AssertionError("no line from kvgate serve in time")


@pytest.mark.slow
def test_serve_says_ready_only_once_every_model_has_a_healthy_replica(tmp_path: Path) -> None:
    gateway, engine = free_port(), free_port()
    path = tmp_path / "kvgate.yaml"
    path.write_text(json.dumps({
        "listen": {"host": "127.0.0.1", "port": gateway},
        "models": [{"name": "m", "pools": ["main"]}],
        "pools": {"main": {"role": "interactive", "served_model": "m", "replicas": [f"http://127.0.0.1:{engine}"],
                           "price": {"input_per_m": 1.0, "cached_input_per_m": 0.1, "output_per_m": 2.0}}},
        "routing": {"probe_interval_s": 0.2, "healthy_after": 1, "unhealthy_after": 1},
    }))
    run = [sys.executable, "-m", "app.cli"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with contextlib.ExitStack() as es:
        proc = subprocess.Popen([*run, "serve", "--config", str(path)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        es.callback(stop, proc)
        first = _line(proc, time.monotonic() + 30)
        url = f"http://127.0.0.1:{gateway}"
        waiting = f"kvgate listening on {url}, not ready: no healthy replica for model(s) m - pools main (0/1"
        assert first.startswith(waiting), first
        sim = subprocess.Popen([*run, "sim", "--port", str(engine), "--model", "m"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        es.callback(stop, sim)
        ready = _line(proc, time.monotonic() + 60)
        assert ready.startswith(f"kvgate ready on {url} - pools main (1/1 replica healthy)"), ready
