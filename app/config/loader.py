"""The gateway's configuration: YAML file + `KVGATE_*` environment overrides, validated up front.

The schema (every key and its default) is in app/config/models.py; this module loads it and reports every
problem with its key path (`pools.fast.replicas[0]: not a URL`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource

from app.config.models import (
    URL_RE,
    AuthConfig,
    BackoffConfig,
    BreakerSettings,
    GatewayConfig,
    LimitsConfig,
    Listen,
    ModelConfig,
    NormalizeConfig,
    NormalizeMode,
    PoolConfig,
    PriceConfig,
    ReferencePrice,
    RouteClassName,
    RoutingConfig,
    SpillSettings,
    StoreConfig,
    TelemetryConfig,
    TenantConfig,
    UpstreamConfig,
)

EMBEDDED_CONFIG = Path(__file__).resolve().parent.parent / "defaults" / "local.yaml"  # config/local.yaml links here

__all__ = [
    "EMBEDDED_CONFIG", "AuthConfig", "BackoffConfig", "BreakerSettings", "ConfigError", "GatewayConfig",
    "LimitsConfig", "Listen", "ModelConfig", "NormalizeConfig", "NormalizeMode", "PoolConfig", "PriceConfig",
    "Problem", "ReferencePrice", "RouteClassName", "RoutingConfig", "SpillSettings", "StoreConfig",
    "TelemetryConfig", "TenantConfig", "UpstreamConfig", "load_config", "parse_config",
]


@dataclass(frozen=True, slots=True)
class Problem:
    """One configuration problem, located by its key path."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(Exception):
    """The configuration cannot be used; carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def _loc_to_path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + part
    return out


def _problems_from_validation(err: ValidationError) -> list[Problem]:
    return [Problem(_loc_to_path(e["loc"]), e["msg"].removeprefix("Value error, ")) for e in err.errors()]


def _semantic_problems(cfg: GatewayConfig) -> list[Problem]:
    from app.config.normalize import RULES as known_rules

    problems: list[Problem] = []
    seen_models: set[str] = set()
    for i, m in enumerate(cfg.models):
        if m.name in seen_models:
            problems.append(Problem(f"models[{i}].name", f"duplicate model {m.name!r}"))
        seen_models.add(m.name)
        for j, pool in enumerate(m.pools):
            if pool not in cfg.pools:
                problems.append(Problem(f"models[{i}].pools[{j}]", f"unknown pool {pool!r}"))
    seen_tenants: set[str] = set()
    seen_keys: set[str] = set()
    for i, t in enumerate(cfg.tenants):
        if t.id in seen_tenants:
            problems.append(Problem(f"tenants[{i}].id", f"duplicate tenant {t.id!r}"))
        seen_tenants.add(t.id)
        for j, key in enumerate(t.api_keys):
            if key in seen_keys:
                problems.append(Problem(f"tenants[{i}].api_keys[{j}]", "key already used by another tenant"))
            seen_keys.add(key)
            if key.startswith("sha256:") and not re.fullmatch(r"sha256:[0-9a-f]{64}", key):
                problems.append(Problem(f"tenants[{i}].api_keys[{j}]", "sha256: needs 64 lowercase hex digits"))
        for j, rule in enumerate(t.normalize_rules or ()):
            if rule not in known_rules:
                known = ", ".join(known_rules)
                problems.append(Problem(f"tenants[{i}].normalize_rules[{j}]", f"unknown rule {rule!r}; known: {known}"))
    if cfg.telemetry.otlp_endpoint is not None and not URL_RE.match(cfg.telemetry.otlp_endpoint):
        problems.append(Problem("telemetry.otlp_endpoint", "not a URL"))
    return problems


class _Env(EnvSettingsSource):
    """pydantic-settings' `KVGATE_` / `__` reading over a given mapping; values parse as YAML (a superset of
    JSON: compose files write `[{name: m, pools: [fast]}]`), an empty value as null."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._given = env
        super().__init__(GatewayConfig)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        given = self._given.items()
        return {k.lower(): (v if v != "" else "null") for k, v in given if k.upper().startswith("KVGATE_")}

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        """Complex values (lists, objects) as YAML flow collections."""
        return yaml.safe_load(value) if isinstance(value, str) else value


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(merged.get(k), dict):
            merged[k] = _deep_merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def _scalars(node: Any) -> Any:
    # Leaf strings that are YAML scalars (`on`, `3`, `null`) are read the way the YAML file reads them.
    if isinstance(node, dict):
        return {k: _scalars(v) for k, v in node.items()}
    if isinstance(node, str):
        try:
            return yaml.safe_load(node)
        except yaml.YAMLError:
            return node
    return node


def parse_config(raw: Mapping[str, Any], env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Validate a raw config mapping (plus `KVGATE_*` overrides) or raise ConfigError with every problem."""
    data = _deep_merge(dict(raw), _scalars(_Env(os.environ if env is None else env)()))
    try:
        cfg = GatewayConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_problems_from_validation(err)) from None
    problems = _semantic_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Load a YAML config file (default: the embedded `config/local.yaml`) and validate it."""
    environ = os.environ if env is None else env
    chosen = Path(path or environ.get("KVGATE_CONFIG") or EMBEDDED_CONFIG)
    try:
        text = chosen.read_text()
    except OSError as err:
        raise ConfigError([Problem("", f"cannot read {chosen}: {err.strerror}")]) from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError([Problem("", f"{chosen}: invalid YAML: {err}")]) from None
    if not isinstance(raw, dict):
        raise ConfigError([Problem("", f"{chosen}: top level must be a mapping")])
    return parse_config(raw, environ)
