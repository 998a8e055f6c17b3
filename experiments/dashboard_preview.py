"""The docs' dashboard previews (docs/img/kvgate-{cost,vllm}-preview.png), reproducibly: a compose-like stack on
loopback under phases of `kvgate bench` traffic, then grafana/preview.py on both dashboards.

The stack is tests/deploy/test_dashboard_queries.py's (tests/deploy/stack.py), with two gateway processes:
Redis (REDIS_URL under a key prefix of our own, else a throwaway redis-server), `kvgate sim` engines publishing KV
events (fast with speculative decoding; bulk found by discovery), TWO `kvgate serve` processes on that Redis (so
peer load shares between them and limits and spend are common), and Prometheus on config/prometheus.yml with
every hostname re-pointed at loopback ports (both gateways in the gateway job; their /metrics stand in for the
collector's exporter, as in the test). The fast pool's second engine starts late (a joining replica, pre-warmed)
and is restarted later (it was unhealthy: pre-warmed again, so the panels show a join and a recovery).

Traffic, three tenants, --minutes split over the phases below (PHASES): mixed, agent, a bulk burst, mixed with
one tenant far over its rpm; that tenant sends under its limit in the earlier phases.

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/dashboard_preview.py [--minutes 7] [--out-dir docs/img]

Child processes write to log files in a temp dir (printed; kept with --keep-logs or when the run fails).
Everything started is stopped on exit, error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvlab.net import free_port  # noqa: E402
from kvlab.procs import spawn, stop, wait_ready  # noqa: E402
from kvlab.stack import (  # noqa: E402
    FAST_SIM,
    MODEL,
    gateway_config,
    prometheus_argv,
    prometheus_config,
    redis_store,
    sim_argv,
    sim_ports,
)

KVGATE = [sys.executable, "-m", "app.cli"]
SCRAPE_S = 1  # short-lived states (a replica warming for a second) still get a sample
KEYS = {"acme": "sk-preview-acme", "globex": "sk-preview-globex", "initech": "sk-preview-initech"}
RPM = 30  # initech's limit: 0.4 req/s stays under it, 2 req/s is four times over
DASHBOARDS = {"kvgate-cost.json": "kvgate-cost-preview.png", "kvgate-vllm.json": "kvgate-vllm-preview.png"}
TENANTS: list[dict[str, Any]] = [
    {"id": "acme", "api_keys": [KEYS["acme"]], "default_class": "interactive", "normalize": "on"},
    {"id": "globex", "api_keys": [KEYS["globex"]], "default_class": "bulk", "normalize": "observe"},
    {"id": "initech", "api_keys": [KEYS["initech"]], "limits": {"rpm": RPM}},
]
# Bulk's TTFT SLO: low enough that the burst saturates bulk, so bulk borrows the idle fast pool.
BULK_TTFT_SLO_MS = 100.0


@dataclass
class Bench:
    """One `kvgate bench` run of a phase: its tenants' keys, workload and load."""

    name: str
    keys: list[str]
    workload: str
    load: list[str]  # --concurrency N or --rate R

    def argv(self, urls: list[str], seconds: float, logs: Path) -> list[str]:
        """The command line, sessions spread over every gateway process."""
        bases = [a for url in urls for a in ("--base-url", f"{url}/v1")]
        return [
            *KVGATE, "bench", *bases, "--api-keys", ",".join(self.keys), "--model", MODEL,
            "--workload", self.workload, *self.load, "--duration", f"{seconds:.0f}", "--timeout", "60",
            "--quiet", "--json", str(logs / f"{self.name}.json"), "--json-summary-only",
        ]  # fmt: skip


@dataclass
class Phase:
    """A slice of the run: benches in parallel for `share` of --minutes, after `at_start` (a stack event)."""

    name: str
    share: float
    benches: list[Bench]
    at_start: str = ""  # "join": start the late fast engine; "restart": stop it and start it again
    seconds: float = field(default=0.0)


def _phases() -> list[Phase]:
    """Mixed, agent, a bulk burst, then mixed with initech over its rpm; initech under it until then."""
    a, g, i = KEYS["acme"], KEYS["globex"], KEYS["initech"]
    polite = Bench("initech-polite", [i], "chat", ["--rate", "0.4"])
    return [
        Phase("mixed", 0.25, [Bench("mixed", [a, g], "mixed", ["--concurrency", "8"]), polite]),
        Phase("agent", 0.25, [Bench("agent", [a], "agent", ["--concurrency", "6"]),
                              Bench("agent-bulk", [g], "chat", ["--concurrency", "2"]), polite], "join"),
        Phase("bulk-burst", 0.2, [Bench("burst", [g], "bulk", ["--concurrency", "48"]),
                                  Bench("burst-chat", [a], "chat", ["--concurrency", "1"]), polite], "restart"),
        Phase("over-rpm", 0.3, [Bench("mixed-2", [a, g], "mixed", ["--concurrency", "8"]),
                                Bench("initech-flood", [i], "chat", ["--rate", "2"])]),
    ]  # fmt: skip


class Run:
    """The stack: processes (stopped by the ExitStack), their ports, and the late engine's handle."""

    def __init__(self, es: ExitStack, logs: Path) -> None:
        self.es, self.logs = es, logs
        sims = ("vllm-fast", "vllm-fast-2", "vllm-bulk")
        self.ports = {"gateway": free_port(), "gateway-2": free_port(), "prometheus": free_port(), **sim_ports(sims)}
        self.gateways = [f"http://127.0.0.1:{self.ports[g]}" for g in ("gateway", "gateway-2")]
        self.prometheus = f"http://127.0.0.1:{self.ports['prometheus']}"
        self.late: subprocess.Popen[bytes] | None = None

    def start(self, store: dict[str, Any]) -> None:
        """Sims, both gateways, then Prometheus; returns once each answers."""
        for sim, extra in (("vllm-fast", FAST_SIM), ("vllm-bulk", [])):
            self._sim(sim, extra)
        cfg = gateway_config(self.ports, store, tenants=TENANTS, bulk_ttft_slo_ms=BULK_TTFT_SLO_MS)
        cfg_path = self.logs / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        for name, url in zip(("gateway", "gateway-2"), self.gateways, strict=True):
            argv = [*KVGATE, "serve", "--config", str(cfg_path), "--port", str(self.ports[name])]
            wait_ready(f"{url}/ready", spawn(self.es, self.logs, name, argv), self.logs, name)
        gateways = [self.ports["gateway"], self.ports["gateway-2"]]
        targets = {
            "gateway": gateways, "otel-collector": gateways, "localhost": [self.ports["prometheus"]],
            # The late engine is scraped from the start, as a restarted pod would be: `up` shows it down first.
            "vllm-fast": [self.ports["vllm-fast"], self.ports["vllm-fast-2"]], "vllm-bulk": [self.ports["vllm-bulk"]],
        }  # fmt: skip
        prom_cfg = self.logs / "prometheus.yml"
        prom_cfg.write_text(yaml.safe_dump(prometheus_config(targets, SCRAPE_S)))
        argv = prometheus_argv(prom_cfg, self.logs / "tsdb", self.ports["prometheus"])
        wait_ready(f"{self.prometheus}/-/ready", spawn(self.es, self.logs, "prometheus", argv), self.logs, "prometheus")

    def _sim(self, sim: str, extra: list[str]) -> subprocess.Popen[bytes]:
        proc = spawn(self.es, self.logs, sim, sim_argv(KVGATE, self.ports, sim, extra))
        wait_ready(f"http://127.0.0.1:{self.ports[sim]}/health", proc, self.logs, sim)
        return proc

    def event(self, what: str) -> None:
        """A phase's stack event: the late fast engine joins, or restarts (unhealthy, then back, pre-warmed again)."""
        if what == "restart" and self.late is not None:
            stop(self.late)
            time.sleep(3)  # several failed probes: the gateways mark it unhealthy
        if what in ("join", "restart"):
            self.late = self._sim("vllm-fast-2", FAST_SIM)
            print(f"  vllm-fast-2 {'joined' if what == 'join' else 'restarted'}", flush=True)

    def phase(self, phase: Phase) -> None:
        """Run a phase's benches side by side until they finish (a stuck one is stopped past its time)."""
        t0 = time.monotonic()
        procs = [(b, spawn(self.es, self.logs, b.name, b.argv(self.gateways, phase.seconds, self.logs)))
                 for b in phase.benches]  # fmt: skip
        if phase.at_start:
            self.event(phase.at_start)
        for bench, proc in procs:
            try:
                proc.wait(timeout=max(1.0, phase.seconds + 90 - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                stop(proc)
            print(f"  {bench.name}: {_summary(self.logs / f'{bench.name}.json')}", flush=True)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant PromQL query."""
        r = httpx.post(f"{self.prometheus}/api/v1/query", data={"query": expr}, timeout=10)
        return list(r.json()["data"]["result"])


def _summary(path: Path) -> str:
    """One line from a bench's --json: requests, ok, errors by kind."""
    if not path.exists():
        return "no result (see its log)"
    doc = json.loads(path.read_text())
    runs = doc if isinstance(doc, list) else [doc]
    s = runs[-1]["summary"]
    kinds = ", ".join(f"{k} {n}" for k, n in s["error_kinds"].items())
    return f"{s['requests']} requests, {s['ok']} ok" + (f", errors: {kinds}" if kinds else "")


def _check(run: Run) -> list[str]:
    """What the cluster panels need, read back from Prometheus: a line per fact, for the log."""
    facts = {
        "gateway processes sharing": "max(gateway_peer_load_processes)",
        "shared exchanges": 'sum(gateway_peer_load_exchanges_total{outcome="shared"})',
        "pre-warm runs": "sum by (result) (gateway_prewarm_runs_total) > 0",
        "replicas with KV events": "count(sum by (replica) (gateway_kv_events_received_total) > 0)",
        "discovered bulk replicas": 'max(gateway_discovery_replicas{pool="bulk"})',
        "initech limited": 'sum(gateway_rate_limited_total{tenant="initech"})',
    }
    out = []
    for label, expr in facts.items():
        res = run.query(expr)
        values = ", ".join(
            f"{s['metric'].get('result', '')} {float(s['value'][1]):g}".strip() for s in res
        ) or "none"
        out.append(f"  {label}: {values}")
    return out


def _render(run: Run, out_dir: Path, window_s: float) -> None:
    """grafana/preview.py on each dashboard, the window covering the whole run."""
    minutes = str(math.ceil(window_s / 60))
    for dashboard, png in DASHBOARDS.items():
        subprocess.run(
            [sys.executable, str(ROOT / "grafana" / "preview.py"), "--prometheus", run.prometheus,
             "--minutes", minutes, str(ROOT / "grafana" / "dashboards" / dashboard), str(out_dir / png)],
            check=True, cwd=ROOT, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds the ExitStack like Ctrl-C: every child stopped


def main(argv: list[str] | None = None) -> int:
    """CLI entry."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=7.0, help="minutes of bench traffic over all phases")
    p.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "img")
    p.add_argument("--keep-logs", action="store_true", help="keep the temp dir of child logs")
    args = p.parse_args(argv)
    missing = [b for b in ("prometheus", "redis-server") if shutil.which(b) is None]
    if "prometheus" in missing or (missing and not os.environ.get("REDIS_URL")):
        sys.exit(f"needs {' and '.join(missing)} on PATH (Debian: apt-get install prometheus redis-server)")
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (SIGINT ignored)
    logs = Path(tempfile.mkdtemp(prefix="kvgate-preview-"))
    print(f"logs in {logs}", flush=True)
    t0 = time.monotonic()
    try:
        _run(args, logs)
    except KeyboardInterrupt:
        print(f"interrupted: everything it started is stopped; logs kept in {logs}", file=sys.stderr)
        return 130
    except Exception:
        print(f"failed: everything it started is stopped; logs kept in {logs}", file=sys.stderr)
        raise
    if not args.keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    print(f"done in {time.monotonic() - t0:.0f} s")
    return 0


def _run(args: argparse.Namespace, logs: Path) -> None:
    """Stack up, the phases, the renders; the ExitStack stops every child however this ends."""
    t0 = time.monotonic()
    with ExitStack() as es:
        store = es.enter_context(redis_store(logs))
        run = Run(es, logs)
        run.start(store)
        started = time.monotonic()
        print(f"stack up in {started - t0:.0f} s: gateways {' '.join(run.gateways)}, {run.prometheus}", flush=True)
        time.sleep(3 * SCRAPE_S)  # baseline scrapes before traffic, so rate() sees the first increase
        for phase in _phases():
            phase.seconds = phase.share * args.minutes * 60
            print(f"phase {phase.name}: {phase.seconds:.0f} s", flush=True)
            run.phase(phase)
        time.sleep(5 * SCRAPE_S)  # the last requests' metrics scraped
        print("\n".join(_check(run)), flush=True)
        _render(run, args.out_dir, time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main())
