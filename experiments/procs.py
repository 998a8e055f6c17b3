"""Real processes for the benchmarks: `kvgate sim` replicas, a `kvgate serve` gateway, proxies, /metrics scrapes.

Shared by experiments/overhead.py, experiments/peers.py, experiments/routing_eval.py and
experiments/routing_faults.py. Every process is started by us, on loopback, and stopped by its own pid.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
KVGATE = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())"]
MODEL = "smollm2-135m"


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(
    url: str, timeout_s: float = 30.0, proc: subprocess.Popen[bytes] | None = None, *, any_status: bool = False
) -> None:
    """Poll `url` until it answers 200 (any status with `any_status`); raise after `timeout_s` or if `proc` died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            status = httpx.get(url, timeout=1.0).status_code
            if status == 200 or any_status:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


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
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 - lives with the child
        self.popen = subprocess.Popen(self.argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        wait_http(self.url + ready_path, timeout_s, self.popen, any_status=any_status)
        return self

    def kill(self) -> None:
        """SIGKILL: the crash case (no graceful drain)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()


def sim_proc(name: str, args: Sequence[str], *, time_scale: float, port: int | None = None,
             log_dir: Path | None = None) -> Proc:
    """A `kvgate sim` replica (not started) serving MODEL with the h100-8b profile unless `args` says otherwise."""
    port = port or free_port()
    argv = [*KVGATE, "sim", "--port", str(port), "--model", MODEL, "--time-scale", str(time_scale),
            "--log-level", "warning", *args]
    log = log_dir / f"{name}.log" if log_dir else None
    return Proc(name, f"http://127.0.0.1:{port}", argv, log=log)


def gateway_config(pools: dict[str, dict[str, Any]], *, tenants: Iterable[dict[str, Any]] = (),
                   routing: dict[str, Any] | None = None, upstream: dict[str, Any] | None = None) -> dict[str, Any]:
    """A gateway config: one public model MODEL over `pools` (name -> role/replicas/policy/...)."""
    full_pools = {}
    for name, p in pools.items():
        full = {"served_model": MODEL, "price": {"gpu_hour_usd": 2.5, "gpus": 1, "capacity_tokens_per_s": 5000}}
        full.update(p)
        full_pools[name] = full
    tenant_list = list(tenants)
    return {
        "models": [{"name": MODEL, "pools": list(pools)}],
        "pools": full_pools,
        "tenants": tenant_list,
        "auth": {"required": bool(tenant_list)},
        "routing": routing or {},
        "upstream": upstream or {},
    }


def gateway_proc(name: str, cfg: dict[str, Any], *, port: int | None = None, log_dir: Path | None = None) -> Proc:
    """A `kvgate serve` process (not started) on the given config."""
    port = port or free_port()
    fd, path = tempfile.mkstemp(prefix=f"kvgate-{name}-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(cfg, f)
    argv = [*KVGATE, "serve", "--config", path, "--port", str(port), "--log-level", "warning"]
    log = log_dir / f"{name}.log" if log_dir else None
    return Proc(name, f"http://127.0.0.1:{port}", argv, log=log)


def from_checkout(proc: Proc, code: Path) -> Proc:
    """Run `proc` (a kvgate command) from another checkout's app/ (`git archive <commit> app | tar -x -C DIR`), for
    a before/after table: `-c` puts the working directory (this checkout) first on sys.path, so insert the other."""
    boot = f"import sys; sys.path.insert(0, {str(code.resolve())!r}); from app.cli import main; sys.exit(main())"
    proc.argv = [sys.executable, "-c", boot, *proc.argv[len(KVGATE) :]]
    return proc


def parse_prom(text: str) -> dict[str, float]:
    """Prometheus text → {series name with labels: value} (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def metric_sum(sample: dict[str, float], name: str, **labels: str) -> float:
    """Sum of every series of `name` whose labels include `labels`."""
    total = 0.0
    for key, value in sample.items():
        base = key.split("{", 1)[0]
        if base != name:
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """One /metrics scrape of `url` (empty when unreachable)."""
    try:
        r = httpx.get(url + "/metrics", timeout=timeout_s)
    except httpx.TransportError:
        return {}
    return parse_prom(r.text) if r.status_code == 200 else {}


async def ascrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """Async /metrics scrape (empty when unreachable)."""
    try:
        r = await client.get(url + "/metrics")
    except httpx.TransportError:
        return {}
    return parse_prom(r.text) if r.status_code == 200 else {}


def reset_prefix_cache(urls: Iterable[str]) -> None:
    """POST /reset_prefix_cache on each replica (between arms, so neither starts warm)."""
    for url in urls:
        httpx.post(url + "/reset_prefix_cache", timeout=10).raise_for_status()


@dataclass
class Counters:
    """Per-replica counter deltas over one arm (from /metrics before and after)."""

    before: dict[str, dict[str, float]] = field(default_factory=dict)
    after: dict[str, dict[str, float]] = field(default_factory=dict)

    def delta(self, url: str, name: str, **labels: str) -> float:
        """after - before of one counter on one replica."""
        return metric_sum(self.after.get(url, {}), name, **labels) - metric_sum(self.before.get(url, {}), name,
                                                                                 **labels)
