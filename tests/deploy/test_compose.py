"""The compose stack agrees with the project: images, healthchecks, hostnames, ports, Prometheus targets,
Grafana provisioning, and the metric names between the gateway, the collector and the dashboards.

Docker cannot run here, so the files are parsed (PyYAML, with compose's merge and interpolation rules in
tests/deploy/files.py) and checked against the gateway's own config loader and instrument table.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import GatewayConfig
from app.telemetry import instruments as inst
from tests.config_env import parse_with_env
from tests.deploy.files import (
    COMPOSE,
    COMPOSE_AIRGAPPED,
    COMPOSE_CPU,
    COMPOSE_VLLM_CPU,
    DASHBOARDS,
    ENV_EXAMPLE,
    ROOT,
    VLLM_KV_EVENTS_KEYS,
    bound_port,
    dashboard_targets,
    effective_compose,
    flag,
    host_port,
    interpolate,
    kv_events_json,
    kv_publishing,
    metric_names,
    prometheus_name,
    read_env_file,
    variables,
)

GPU = effective_compose(COMPOSE)
CPU = effective_compose(COMPOSE, COMPOSE_CPU)
# What scripts/compose-airgapped.sh runs: real vLLM-CPU engines, no collector, no Grafana.
VLLM_CPU = effective_compose(COMPOSE, COMPOSE_VLLM_CPU, COMPOSE_AIRGAPPED,
                             env={**read_env_file(ENV_EXAMPLE), "SERVED_MODEL_NAME": "smollm2-135m"})
STACKS = {"gpu": GPU, "cpu": CPU, "vllm-cpu": VLLM_CPU}
PROMETHEUS = yaml.safe_load((ROOT / "config" / "prometheus.yml").read_text())
COLLECTOR = yaml.safe_load((ROOT / "config" / "otel-collector.yaml").read_text())
# The vLLM metric families the dashboards may use (shared/reference/vllm.md, V1 names).
VLLM_METRICS = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total", "vllm:num_preemptions_total", "vllm:request_success_total",
    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    *(
        f"vllm:{h}_{s}"
        for h in (
            "time_to_first_token_seconds", "inter_token_latency_seconds",
            "request_time_per_output_token_seconds", "e2e_request_latency_seconds",
            "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
        )
        for s in ("bucket", "sum", "count")
    ),
}


def services(stack: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name → service definition."""
    return dict(stack["services"])


def resolve(stack: dict[str, Any], host: str) -> tuple[str, dict[str, Any]]:
    """The service a hostname reaches on the compose network (service name or `hostname:`)."""
    for name, svc in services(stack).items():
        if host in (name, svc.get("hostname")):
            return name, svc
    raise AssertionError(f"no compose service answers to hostname {host!r}")


def gateway_config(stack: dict[str, Any]) -> GatewayConfig:
    """config/gateway.yaml as the gateway container loads it: the mounted file plus its KVGATE_* env."""
    gw = services(stack)["gateway"]
    target = flag(gw["command"], "--config")
    mounts = [v.split(":") for v in gw["volumes"]]
    source = next(src for src, dst, *_ in mounts if dst == target)
    raw = yaml.safe_load((ROOT / source).read_text())
    env = {k: str(v) for k, v in gw.get("environment", {}).items()}
    return parse_with_env(raw, env)


def listen_port(svc: dict[str, Any]) -> int:
    """The port an engine service listens on inside the network (vLLM's or the sim's --port)."""
    port = flag(svc["command"], "--port")
    return int(port) if port else 8000  # vLLM's default


def test_compose_variables_are_all_documented_in_env_example() -> None:
    documented = set(read_env_file(ENV_EXAMPLE))
    used = set().union(*(variables(f.read_text()) for f in (COMPOSE, COMPOSE_CPU, COMPOSE_VLLM_CPU, COMPOSE_AIRGAPPED)))
    assert used - documented == set(), "compose variables missing from .env.example"


def test_compose_runs_with_only_the_required_variables_set() -> None:
    required = {"KVGATE_SALT_SECRET", "GRAFANA_ADMIN_PASSWORD", "SPECULATIVE_CONFIG"}
    raw = yaml.safe_load(COMPOSE.read_text())
    interpolate(raw, dict.fromkeys(required, "x"))
    for name in required:
        with pytest.raises(KeyError, match=name):
            interpolate(raw, dict.fromkeys(required - {name}, "x"))


@pytest.mark.parametrize("stack", STACKS.values(), ids=STACKS.keys())
def test_every_service_has_a_healthcheck(stack: dict[str, Any]) -> None:
    for name, svc in services(stack).items():
        hc = svc.get("healthcheck")
        assert hc and not hc.get("disable"), f"{name}: no healthcheck"
        test = hc["test"]
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name


@pytest.mark.parametrize("stack", STACKS.values(), ids=STACKS.keys())
def test_every_image_is_pinned(stack: dict[str, Any]) -> None:
    for name, svc in services(stack).items():
        image = svc.get("image")
        assert image, f"{name}: no image name (a built service needs one to be pinned)"
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag and tag not in ("", "latest"), f"{name}: {image} is not pinned"
        assert re.search(r"\d", tag), f"{name}: tag {tag!r} names no version"


@pytest.mark.parametrize("stack", STACKS.values(), ids=STACKS.keys())
def test_gateway_replicas_reach_engine_services_on_their_listen_port(stack: dict[str, Any]) -> None:
    cfg = gateway_config(stack)
    for pool_name, pool in cfg.pools.items():
        for url in pool.replicas:
            host, port = host_port(url, 80)
            name, svc = resolve(stack, host)
            assert port == listen_port(svc), f"pool {pool_name}: {url} but {name} listens on {listen_port(svc)}"


@pytest.mark.parametrize("stack", STACKS.values(), ids=STACKS.keys())
def test_engines_serve_the_model_name_the_gateway_asks_for(stack: dict[str, Any]) -> None:
    cfg = gateway_config(stack)
    for pool in cfg.pools.values():
        _, svc = resolve(stack, host_port(pool.replicas[0], 80)[0])
        served = flag(svc["command"], "--served-model-name") or flag(svc["command"], "--model")
        assert served == pool.served_model
    public = {m.name for m in cfg.models}
    assert {p.served_model for p in cfg.pools.values()} <= public


ENGINES = ("vllm-fast", "vllm-bulk")
# The vLLM-CPU venv scripts/vllm-cpu.sh installs: the same vLLM 0.32 source and argument parser as the image's.
VLLM_VENV = Path(os.environ.get("KVGATE_CACHE", str(Path.home() / ".cache" / "kvgate"))) / "vllm-venv"
VLLM_KV_EVENTS_SOURCE = VLLM_VENV / "lib/python3.11/site-packages/vllm/config/kv_events.py"
# Runs in that venv: parse each command line with `vllm serve`'s own parser and checks (as the OpenAI server does
# before it loads a model), then print what the engine arguments made of it.
_VLLM_PARSE = """
import dataclasses, json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.loads(sys.stdin.read()):
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(ns)
    args = AsyncEngineArgs.from_cli_args(ns)
    out.append({"kv_events": dataclasses.asdict(args.kv_events_config), "algo": args.prefix_caching_hash_algo,
                "prefix_caching": args.enable_prefix_caching})
print("RESULT " + json.dumps(out))
"""


def test_engines_publish_kv_events_with_a_config_vllm_accepts() -> None:
    from app.kvcache.tokens import RequestBlocks

    gateway_algo = inspect.signature(RequestBlocks).parameters["algo"].default
    for name in ENGINES:
        command = services(GPU)[name]["command"]
        cfg = kv_events_json(command)
        assert cfg is not None, f"{name}: no --kv-events-config"
        assert set(cfg) <= VLLM_KV_EVENTS_KEYS, f"{name}: not KVEventsConfig keys: {set(cfg) - VLLM_KV_EVENTS_KEYS}"
        assert cfg["enable_kv_cache_events"] is True and cfg["publisher"] == "zmq", name
        # vLLM binds only wildcard endpoints (it connects out to a concrete host); the replay ROUTER always binds.
        assert bound_port(cfg["endpoint"]) != bound_port(cfg["replay_endpoint"]), name
        assert cfg["topic"], f"{name}: a topic, so a subscriber filters on it"
        # Events come from the prefix cache: vLLM 0.32 enables it by default, so it must not be switched off.
        assert flag(command, "--no-enable-prefix-caching") is None, name
        # Hashes the gateway can reproduce from token ids (pools.<p>.tokenizer) are the ones it computes itself.
        assert flag(command, "--prefix-caching-hash-algo") == gateway_algo == "sha256_cbor", name
    fast, bulk = (kv_events_json(services(GPU)[n]["command"]) for n in ENGINES)
    assert fast == bulk, "one KV-event configuration for both engines (each has its own address)"


@pytest.mark.skipif(not VLLM_KV_EVENTS_SOURCE.is_file(), reason="no vLLM-CPU venv (scripts/vllm-cpu.sh install)")
def test_kv_events_keys_are_vllms_own_config_fields() -> None:
    tree = ast.parse(VLLM_KV_EVENTS_SOURCE.read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KVEventsConfig"]
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert fields == VLLM_KV_EVENTS_KEYS
    [publisher] = [n for n in cls.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "publisher"]
    assert "'zmq'" in ast.unparse(publisher.annotation)


@pytest.mark.slow
@pytest.mark.skipif(not (VLLM_VENV / "bin" / "python").exists(), reason="no vLLM-CPU venv (scripts/vllm-cpu.sh)")
def test_vllms_own_parser_accepts_the_engine_commands_and_reads_the_kv_events_config() -> None:
    commands = [services(stack)[name]["command"] for stack in (GPU, VLLM_CPU) for name in ENGINES]
    out = subprocess.run(
        [str(VLLM_VENV / "bin" / "python"), "-c", _VLLM_PARSE], input=json.dumps(commands),
        capture_output=True, text=True, timeout=300, env={**os.environ, "VLLM_NO_USAGE_STATS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    for name, command, parsed in zip(ENGINES * 2, commands, json.loads(line.removeprefix("RESULT ")), strict=True):
        ours = kv_events_json(command)
        assert ours is not None and {k: parsed["kv_events"][k] for k in ours} == ours, name
        assert parsed["algo"] == "sha256_cbor" and parsed["prefix_caching"] in (None, True), name


@pytest.mark.parametrize("stack", STACKS.values(), ids=STACKS.keys())
def test_every_replica_subscribes_to_the_ports_its_engine_publishes_on(stack: dict[str, Any]) -> None:
    from app.kvcache.sources import EventSource

    cfg = gateway_config(stack)
    for pool_name, pool in cfg.pools.items():
        for url in pool.replicas:
            name, svc = resolve(stack, host_port(url, 80)[0])
            published = kv_publishing(svc["command"])
            assert published is not None, f"{name} publishes no KV events"
            assert published.replay is not None, f"{name}: no replay endpoint to catch up after a reconnect"
            ev = pool.replica_events.get(url)
            assert ev is not None and ev.replay is not None, f"pool {pool_name}: {url} does not subscribe"
            # The engine binds, so the gateway must connect (a tcp://* endpoint would make it bind a collector).
            assert not EventSource(url, ev.endpoint, ev.replay).collector, ev
            for theirs, ours in ((published.endpoint, ev.endpoint), (published.replay, ev.replay)):
                host, port = host_port(ours, 0)
                assert resolve(stack, host)[0] == name, f"{ours} is not {name}'s"
                assert port == bound_port(theirs), f"{ours}, but {name} binds {theirs}"
                assert str(port) in svc["expose"], f"{name} does not expose {port}"
            assert ev.topic == published.topic, f"{url}: topic {ev.topic!r}, {name} publishes {published.topic!r}"


def test_gateway_store_and_otlp_endpoints_are_the_redis_and_collector_services() -> None:
    cfg = gateway_config(GPU)
    assert cfg.store.url is not None and cfg.telemetry.otlp_endpoint is not None
    redis_host, redis_port = host_port(cfg.store.url, 6379)
    name, redis = resolve(GPU, redis_host)
    assert name == "redis" and redis_port == int(flag(redis["command"], "--port") or 6379)
    assert flag(redis["command"], "--appendonly") == "yes", "Redis must persist (AOF)"
    assert any(v.endswith(":/data") for v in redis["volumes"]), "AOF must live on a volume"
    otlp_host, otlp_port = host_port(cfg.telemetry.otlp_endpoint, 4318)
    assert resolve(GPU, otlp_host)[0] == "otel-collector"
    # The gateway speaks OTLP/HTTP: the port must be the collector's http receiver, bound to all interfaces.
    http = COLLECTOR["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert host_port(http, 4318) == ("0.0.0.0", otlp_port)


def test_gateway_listens_where_compose_publishes_and_probes_it() -> None:
    cfg = gateway_config(GPU)
    gw = services(GPU)["gateway"]
    assert cfg.listen.host == "0.0.0.0", "inside a container the gateway must bind every interface"
    assert any(p.endswith(f":{cfg.listen.port}") for p in gw["ports"])
    assert f"127.0.0.1:{cfg.listen.port}/health" in " ".join(gw["healthcheck"]["test"])


def test_the_two_pools_are_configured_as_the_issue_asks() -> None:
    svc = services(GPU)
    fast, bulk = svc["vllm-fast"], svc["vllm-bulk"]
    assert flag(fast["command"], "--speculative-config"), "fast pool must speculate"
    assert flag(fast["command"], "--scheduling-policy") == "priority"
    assert flag(fast["command"], "--enable-prompt-tokens-details") == ""
    assert flag(bulk["command"], "--enable-prompt-tokens-details") == ""
    assert flag(bulk["command"], "--speculative-config") is None
    assert int(flag(bulk["command"], "--max-num-seqs") or 0) > int(flag(fast["command"], "--max-num-seqs") or 0)
    assert flag(bulk["command"], "--max-num-batched-tokens")
    cfg = gateway_config(GPU)
    assert cfg.pools["fast"].priority_scheduling, "the gateway must send priorities the fast engine honours"
    assert flag(fast["command"], "--model") == flag(bulk["command"], "--model"), "both pools serve one model"


def test_engines_share_one_model_cache_and_host_ipc_on_gpus() -> None:
    svc = services(GPU)
    caches = []
    for name in ("vllm-fast", "vllm-bulk"):
        s = svc[name]
        assert s["ipc"] == "host", name
        devices = s["deploy"]["resources"]["reservations"]["devices"]
        assert devices and all("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices), name
        caches.append(next(v.split(":")[0] for v in s["volumes"] if "/.cache/huggingface" in v))
    assert caches[0] == caches[1] and caches[0] in GPU["volumes"], "one named HF cache volume for both"


def test_default_gpu_split_fits_one_gpu() -> None:
    svc = services(GPU)
    fast, bulk = svc["vllm-fast"], svc["vllm-bulk"]

    def device(s: dict[str, Any]) -> list[str]:
        return list(s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"])

    shares = [float(flag(s["command"], "--gpu-memory-utilization") or 0.92) for s in (fast, bulk)]
    if device(fast) == device(bulk):
        assert sum(shares) <= 0.95, f"two engines on one GPU ask for {shares}"


def test_json_speculative_config_in_env_example_is_valid_json() -> None:

    spec = json.loads(read_env_file(ENV_EXAMPLE)["SPECULATIVE_CONFIG"])
    assert spec["method"] and spec["num_speculative_tokens"] >= 1


def test_cpu_stack_needs_no_gpu_and_runs_the_emulator() -> None:
    from app.sim.cli import configure_parser, options_from_args

    svc = services(CPU)
    for name, s in svc.items():
        assert "deploy" not in s or "devices" not in str(s["deploy"]), f"{name} still reserves a GPU"
    for name in ("vllm-fast", "vllm-bulk"):
        assert svc[name]["command"][:2] == ["kvgate", "sim"], name
        assert svc[name]["image"] == svc["gateway"]["image"], "the emulator ships in the gateway image"
        assert "depends_on" not in svc[name] or not svc[name]["depends_on"]
    fast, bulk = svc["vllm-fast"]["command"], svc["vllm-bulk"]["command"]
    assert flag(fast, "--speculative") and flag(bulk, "--speculative") is None
    assert flag(fast, "--scheduling-policy") == "priority"
    for argv in (fast, bulk):  # the emulator accepts exactly these flags
        parser = argparse.ArgumentParser()
        configure_parser(parser)
        options_from_args(parser.parse_args(argv[2:]))


def _scrape_targets(job: str) -> list[tuple[str, dict[str, str]]]:
    jobs = {j["job_name"]: j for j in PROMETHEUS["scrape_configs"]}
    return [(t, sc.get("labels", {})) for sc in jobs[job]["static_configs"] for t in sc["targets"]]


def test_prometheus_scrapes_each_engine_with_its_pool_label() -> None:
    cfg = gateway_config(GPU)
    seen = {}
    for target, labels in _scrape_targets("vllm"):
        host, port = host_port(target, 80)
        _, svc = resolve(GPU, host)
        assert port == listen_port(svc)
        seen[target] = labels["pool"]
    expected = {}
    for pool_name, pool in cfg.pools.items():
        for url in pool.replicas:
            host, port = host_port(url, 80)
            expected[f"{host}:{port}"] = pool_name
    assert seen == expected


def test_prometheus_scrapes_the_collector_exporter_and_the_gateway() -> None:
    exporter = COLLECTOR["exporters"]["prometheus"]["endpoint"]
    [(target, _)] = _scrape_targets("otel-collector")
    assert resolve(GPU, host_port(target, 80)[0])[0] == "otel-collector"
    assert host_port(target, 80)[1] == host_port(exporter, 80)[1]
    [(target, _)] = _scrape_targets("gateway")
    assert resolve(GPU, host_port(target, 80)[0])[0] == "gateway"
    assert host_port(target, 80)[1] == gateway_config(GPU).listen.port


def test_gateway_metrics_are_not_scraped_twice() -> None:
    # Both the collector and the gateway's /metrics expose them; only the collector copy may be kept.
    gateway_job = next(j for j in PROMETHEUS["scrape_configs"] if j["job_name"] == "gateway")
    [drop] = [r for r in gateway_job["metric_relabel_configs"] if r["action"] == "drop"]
    pattern = re.compile(drop["regex"])
    for family in inst.PROMETHEUS_NAMES.values():
        assert pattern.fullmatch(family) and pattern.fullmatch(family + "_bucket"), family


def test_collector_metrics_pipeline_is_otlp_to_prometheus_without_resource_labels() -> None:
    pipeline = COLLECTOR["service"]["pipelines"]["metrics"]
    assert pipeline["receivers"] == ["otlp"] and "prometheus" in pipeline["exporters"]
    assert COLLECTOR["exporters"]["prometheus"]["resource_to_telemetry_conversion"]["enabled"] is False
    for name in ("grpc", "http"):
        assert COLLECTOR["receivers"]["otlp"]["protocols"][name]["endpoint"].startswith("0.0.0.0:")
    svc = services(GPU)["otel-collector"]
    assert any(v.startswith("./config/otel-collector.yaml:") for v in svc["volumes"])


def test_grafana_provisioning_paths_exist_and_point_at_prometheus() -> None:
    graf = services(GPU)["grafana"]
    mounts = {dst: src for src, dst, *_ in (v.split(":") for v in graf["volumes"])}
    for dst, src in mounts.items():
        if src.startswith("./"):
            assert (ROOT / src).exists(), f"grafana mount {src} → {dst} does not exist"
    prov = ROOT / mounts["/etc/grafana/provisioning"]
    [ds_file] = (prov / "datasources").glob("*.yaml")
    [ds] = yaml.safe_load(ds_file.read_text())["datasources"]
    host, port = host_port(ds["url"], 80)
    assert resolve(GPU, host)[0] == "prometheus" and port == 9090
    [prov_file] = (prov / "dashboards").glob("*.yaml")
    [provider] = yaml.safe_load(prov_file.read_text())["providers"]
    dash_dir = provider["options"]["path"]
    assert dash_dir in mounts and (ROOT / mounts[dash_dir]) == DASHBOARDS[0].parent
    home = graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dash_dir) and (DASHBOARDS[0].parent / home.rsplit("/", 1)[1]).exists()
    for path in DASHBOARDS:
        uids = {d["uid"] for _, d in _datasources(path)}
        assert uids == {ds["uid"]}, f"{path.name} uses datasources {uids}"


def _datasources(path: Any) -> list[tuple[str, dict[str, Any]]]:

    data = json.loads(path.read_text())
    out = [(v["name"], v["datasource"]) for v in data["templating"]["list"]]
    for p in data["panels"]:
        if p["type"] != "row":
            out.append((p["title"], p["datasource"]))
            out.extend((p["title"], t["datasource"]) for t in p["targets"])
    return out


def _kind(spec: Any) -> str:
    # Every gateway metric is a monotone counter or a histogram (observed counters included).
    return "histogram" if spec.buckets is not None else "counter"


def _specs_and_kinds() -> list[tuple[Any, str]]:
    """Every metric the gateway exposes with its Prometheus kind: the MetricStore's and those on the meter."""
    return [(spec, _kind(spec)) for spec in inst.ALL_METRICS] + list(inst.METER_METRICS)


def test_collector_names_of_gateway_metrics_are_the_names_the_gateway_states() -> None:
    for spec, kind in _specs_and_kinds():
        assert prometheus_name(spec.name, spec.unit, kind) == inst.PROMETHEUS_NAMES[spec.name]


def _label(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]", "_", name)


# Labels every scraped series may carry besides its own: target labels and the OTel scope.
_COMMON_LABELS = {"job", "instance", "otel_scope_name", "otel_scope_version", "otel_scope_schema_url"}
_VLLM_LABELS = {"model_name", "engine", "pool", "le", "finished_reason", "position"}


def _allowed_labels() -> dict[str, set[str]]:
    """Prometheus series name → label names it can carry."""
    out: dict[str, set[str]] = {}
    for spec, kind in _specs_and_kinds():
        labels = {_label(n) for n in getattr(spec, "labels", ())} | _COMMON_LABELS
        family = inst.PROMETHEUS_NAMES[spec.name]
        if kind == "histogram":
            out |= {f"{family}_bucket": labels | {"le"}, f"{family}_sum": labels, f"{family}_count": labels}
        else:
            out[family] = labels
    for name in VLLM_METRICS:
        out[name] = _VLLM_LABELS | _COMMON_LABELS
    out["up"] = _COMMON_LABELS | {"pool"}
    return out


@pytest.mark.skipif(not hasattr(inst.ALL_METRICS[0], "labels"), reason="MetricSpec states no labels")
@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_queries_use_only_labels_their_metrics_carry(path: Any) -> None:
    allowed = _allowed_labels()
    wrong = set()
    for title, expr in dashboard_targets(path):
        for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr):
            for label in re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", m.group(2)):
                if label not in allowed.get(m.group(1), set()):
                    wrong.add(f"{title}: {m.group(1)} has no label {label}")
        union = set().union(*(allowed.get(n, set()) for n in metric_names(expr)))
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            for label in (g.strip() for g in group.split(",")):
                if label and label not in union:
                    wrong.add(f"{title}: grouping by {label}, which none of its metrics carry")
    assert wrong == set()


def _exposed_families() -> set[str]:
    names = set()
    for spec, kind in _specs_and_kinds():
        family = inst.PROMETHEUS_NAMES[spec.name]
        if kind == "histogram":
            names |= {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
        else:
            names.add(family)
    return names


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_queries_only_metrics_the_stack_exposes(path: Any) -> None:
    gateway = _exposed_families()
    unknown = set()
    for title, expr in dashboard_targets(path):
        for name in metric_names(expr):
            known = VLLM_METRICS if name.startswith("vllm:") else gateway | {"up"}
            if name not in known:
                unknown.add(f"{title}: {name}")
    assert unknown == set()
    assert any(metric_names(e) for _, e in dashboard_targets(path))


def test_metric_name_extraction_ignores_labels_functions_and_keywords() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, pool) (rate(a_b_bucket{pool=~"x|y", le!="1"}[$__rate_interval]))) '
        "/ on (pool) group_left sum without (tenant) (vllm:c_total offset 5m) or vector(0) * 1 + d"
    )
    assert metric_names(expr) == {"a_b_bucket", "vllm:c_total", "d"}


def test_prometheus_name_translation_matches_the_collector_rules() -> None:
    assert prometheus_name("gateway.tenant.cost", "usd", "counter") == "gateway_tenant_cost_usd_total"
    assert prometheus_name("gateway.tenant.cost", "USD", "counter") == "gateway_tenant_cost_USD_total"
    assert prometheus_name("gen_ai.client.token.usage", "{token}", "histogram") == "gen_ai_client_token_usage"
    assert prometheus_name("http.server.duration", "s", "histogram") == "http_server_duration_seconds"
    assert prometheus_name("gateway.queue.saturated", "1", "gauge") == "gateway_queue_saturated_ratio"
    assert prometheus_name("gateway.kv_events.whole", "", "gauge") == "gateway_kv_events_whole"
    assert prometheus_name("queue.latency.seconds", "s", "histogram") == "queue_latency_seconds"
    assert prometheus_name("net.io", "By/s", "gauge") == "net_io_bytes_per_second"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (Debian package prometheus)")
def test_promtool_accepts_the_prometheus_config() -> None:
    out = subprocess.run(
        ["promtool", "check", "config", str(ROOT / "config" / "prometheus.yml")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
