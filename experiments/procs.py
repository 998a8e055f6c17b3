"""Real processes for the benchmarks: `kvgate sim` replicas, a `kvgate serve` gateway, proxies, /metrics scrapes.

Shared by experiments/overhead.py, experiments/peers.py, experiments/routing_eval.py and
experiments/routing_faults.py. Every process is started by us, on loopback, and stopped by its own pid.
"""

from __future__ import annotations

import os
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
sys.path.insert(0, str(ROOT))  # kvlab, when run as a script

from kvlab.configs import gateway_config as lab_gateway_config  # noqa: E402

# Re-exported: the experiments import these from here, beside the helpers below.
from kvlab.net import free_port as free_port  # noqa: E402
from kvlab.net import wait_http as wait_http  # noqa: E402
from kvlab.procs import KVGATE as KVGATE  # noqa: E402
from kvlab.procs import Proc as Proc  # noqa: E402
from kvlab.prom import metric_sum as metric_sum  # noqa: E402
from kvlab.prom import parse_prom as parse_prom  # noqa: E402

MODEL = "smollm2-135m"
LAB_PRICE = {"gpu_hour_usd": 2.5, "gpus": 1, "capacity_tokens_per_s": 5000}


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
    """A gateway config: one public model MODEL over `pools` (name -> role/replicas/policy/...), priced as an
    H100 hour over a measured capacity."""
    return lab_gateway_config(pools, model=MODEL, tenants=tenants, price=LAB_PRICE, routing=routing or {},
                              upstream=upstream or {})


def gateway_proc(name: str, cfg: dict[str, Any], *, port: int | None = None, log_dir: Path | None = None) -> Proc:
    """A `kvgate serve` process (not started) on the given config."""
    port = port or free_port()
    fd, path = tempfile.mkstemp(prefix=f"kvgate-{name}-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(cfg, f)
    argv = [*KVGATE, "serve", "--config", path, "--port", str(port), "--log-level", "warning"]
    log = log_dir / f"{name}.log" if log_dir else None
    return Proc(name, f"http://127.0.0.1:{port}", argv, log=log)


def instant_upstream(core: str, log: Path | None = None) -> Proc:
    """experiments/instant_upstream.py on a free port, pinned to `core`, started."""
    port = free_port()
    proc = Proc("upstream", f"http://127.0.0.1:{port}",
                ["taskset", "-c", core, sys.executable, str(ROOT / "experiments/instant_upstream.py"), str(port)],
                log=log)
    return proc.start(any_status=True)


def program_gateway(name: str, program: str, cfg: Path, core: str, log: Path | None = None) -> Proc:
    """`kvgate serve --config cfg` run as `python -c program` (a boot program that ends in app.cli.main), pinned to
    `core`, on a free port, started."""
    port = free_port()
    proc = Proc(name, f"http://127.0.0.1:{port}",
                ["taskset", "-c", core, sys.executable, "-c", program, "serve", "--config", str(cfg),
                 "--port", str(port), "--log-level", "warning"], log=log)
    return proc.start(any_status=True)


def wait_written(path: Path, timeout_s: float = 5.0, settle_s: float = 0.3) -> None:
    """Wait until a process we signalled has written `path` (non-empty), then `settle_s` more for it to finish."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (path.exists() and path.stat().st_size):
        time.sleep(0.05)
    time.sleep(settle_s)


def from_checkout(proc: Proc, code: Path) -> Proc:
    """Run `proc` (a kvgate command) from another checkout's app/ (`git archive <commit> app | tar -x -C DIR`), for
    a before/after table: `-c` puts the working directory (this checkout) first on sys.path, so insert the other."""
    boot = f"import sys; sys.path.insert(0, {str(code.resolve())!r}); from app.cli import main; sys.exit(main())"
    proc.argv = [sys.executable, "-c", boot, *proc.argv[len(KVGATE) :]]
    return proc


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
