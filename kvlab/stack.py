"""The compose stack's pieces on loopback: `kvgate sim` engines publishing KV events, a gateway config with a fast
pool and a discovered bulk pool, config/prometheus.yml re-pointed at loopback ports, a Redis store, and child
processes whose output goes to log files (never to unread pipes).

Shared by tests/deploy/test_dashboard_queries.py (every dashboard query returns data) and
experiments/dashboard_preview.py (the docs' dashboard previews), so both run the same stack; the processes are
started and awaited with kvlab.procs (`spawn`, `stop`, `wait_ready`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
import yaml

from kvlab.net import free_port
from kvlab.procs import ROOT
from kvlab.redis_server import RedisServer

MODEL = "smollm2-135m"
KEYS = {"acme": "sk-acme-test", "globex": "sk-globex-test", "tiny": "sk-tiny-test"}
# The fast engines' options: speculative decoding for the speculation panels, priority for the classes.
FAST_SIM = ["--speculative", "ngram:3:0.7", "--scheduling-policy", "priority"]


def sim_argv(kvgate: list[str], ports: dict[str, int], sim: str, extra: list[str]) -> list[str]:
    """A sim that publishes KV events and answers replays, as the shipped engines do."""
    return [
        *kvgate, "sim", "--port", str(ports[sim]), "--model", MODEL, "--profile", "h100-8b", *extra,
        "--kv-events", f"tcp://*:{ports[sim + '-kv']}", "--kv-replay", f"tcp://*:{ports[sim + '-replay']}",
        "--kv-topic", "kv",
    ]  # fmt: skip


def sim_ports(sims: tuple[str, ...]) -> dict[str, int]:
    """The names `sim_argv` and `gateway_config` look up for each sim: its HTTP, KV-event and replay ports."""
    return {f"{sim}{suffix}": free_port() for sim in sims for suffix in ("", "-kv", "-replay")}


def _events(ports: dict[str, int], sim: str) -> tuple[str, str]:
    """The KV-event PUB and replay ports of a sim, as the gateway connects to them."""
    return f"tcp://127.0.0.1:{ports[sim + '-kv']}", f"tcp://127.0.0.1:{ports[sim + '-replay']}"


def gateway_config(
    ports: dict[str, int],
    store: dict[str, Any],
    *,
    otlp: str | None = None,
    tenants: list[dict[str, Any]] | None = None,
    bulk_ttft_slo_ms: float = 0.001,
) -> dict[str, Any]:
    """Fast (vllm-fast, vllm-fast-2) and discovered bulk (vllm-bulk) pools on `store`, listening on ports["gateway"].

    The default tenants: acme (interactive, normalize on), globex (bulk, normalize observe), tiny (2 rpm).
    The default bulk TTFT SLO is unattainable: once bulk has a TTFT estimate it counts as saturated, so bulk
    requests borrow the idle fast pool and the spill-over panel has something to show.
    """
    price = {"gpu_hour_usd": 2.50, "gpus": 1}
    fast = [
        {"url": f"http://127.0.0.1:{ports[sim]}", "kv_events": _events(ports, sim)[0],
         "kv_replay": _events(ports, sim)[1], "kv_topic": "kv"}
        for sim in ("vllm-fast", "vllm-fast-2")
    ]  # fmt: skip
    default_tenants = [
        {"id": "acme", "api_keys": [KEYS["acme"]], "default_class": "interactive", "normalize": "on"},
        {"id": "globex", "api_keys": [KEYS["globex"]], "default_class": "bulk", "normalize": "observe"},
        {"id": "tiny", "api_keys": [KEYS["tiny"]], "limits": {"rpm": 2}},
    ]
    telemetry: dict[str, Any] = {"service_name": "kvgate", "metric_export_interval_s": 1}
    if otlp:
        telemetry["otlp_endpoint"] = otlp
    return {
        "listen": {"host": "127.0.0.1", "port": ports["gateway"]},
        "store": store,
        "models": [{"name": MODEL, "pools": ["fast", "bulk"]}],
        "pools": {
            "fast": {
                "role": "interactive",
                "served_model": MODEL,
                # The second replica's engine starts late: it joins, and is pre-warmed.
                "replicas": fast,
                "priority_scheduling": True,
                "price": {**price, "capacity_tokens_per_s": 1500},
            },
            "bulk": {
                "role": "bulk",
                "served_model": MODEL,
                # Found by discovery (an address resolves to itself), for the discovery panels.
                "discovery": {
                    "dns": f"127.0.0.1:{ports['vllm-bulk']}",
                    "interval_s": 0.5,
                    "kv_events": {
                        "endpoint": f"tcp://{{host}}:{ports['vllm-bulk-kv']}",
                        "replay": f"tcp://{{host}}:{ports['vllm-bulk-replay']}",
                        "topic": "kv",
                    },
                },
                "ttft_slo_ms": bulk_ttft_slo_ms,
                "admission": {"enabled": True},  # the queue panels need its metrics
                "price": {**price, "capacity_tokens_per_s": 6000},
            },
        },
        "tenants": default_tenants if tenants is None else tenants,
        "auth": {"required": True},
        "telemetry": telemetry,
        "routing": {"probe_interval_s": 0.2, "healthy_after": 1, "unhealthy_after": 2},
    }


def prometheus_config(targets: dict[str, list[int]], scrape_s: float) -> dict[str, Any]:
    """config/prometheus.yml with each compose hostname pointed at the loopback ports standing in for it
    (several ports: several targets in that hostname's place, e.g. two gateway processes)."""
    cfg = yaml.safe_load((ROOT / "config" / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = f"{scrape_s:g}s"
    cfg["global"]["evaluation_interval"] = f"{scrape_s:g}s"
    for job in cfg["scrape_configs"]:
        for sc in job["static_configs"]:
            sc["targets"] = [f"127.0.0.1:{port}" for t in sc["targets"] for port in targets[t.split(":")[0]]]
    return cfg


def prometheus_argv(cfg_path: Path, data: Path, port: int) -> list[str]:
    """The `prometheus` command line for a config file, a TSDB directory and a loopback port."""
    return [
        "prometheus", f"--config.file={cfg_path}", f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ]  # fmt: skip


@contextmanager
def redis_store(workdir: Path) -> Iterator[dict[str, Any]]:
    """The gateway's store as in compose: Redis (REDIS_URL under a key prefix of our own, else a
    throwaway redis-server with AOF on); our keys are deleted afterwards."""
    url = os.environ.get("REDIS_URL")
    server = None
    if not url:
        server = RedisServer(workdir, appendonly=True)
        server.start()
        url = server.url
    prefix = f"kvgate-deploy-test:{uuid.uuid4().hex[:12]}:"
    try:
        yield {"url": url, "key_prefix": prefix}
    finally:
        client = redis.Redis.from_url(url)
        for key in client.scan_iter(match=f"{prefix}*", count=500):
            client.delete(key)
        client.close()
        if server is not None:
            server.stop()
