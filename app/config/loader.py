"""The gateway's configuration: YAML file + `KVGATE_*` environment overrides, validated up front.

The schema (every key and its default) is in app/config/models.py, documented in docs/config.md (generated from
it: `python -m app.config.docs`); this module loads it and reports every problem with its key path
(`pools.fast.replicas[0]: not a URL`).
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

from app.config.env import EnvValueError
from app.config.models import (
    URL_RE,
    BreakerSettings,
    GatewayConfig,
    Listen,
    ModelConfig,
    NormalizeConfig,
    PoolConfig,
    PriceConfig,
    RoutingConfig,
    SpillSettings,
    StoreConfig,
    TelemetryConfig,
)
from app.config.tenants import AuthConfig, LimitsConfig, ReferencePrice, TenantConfig
from app.config.types import NormalizeMode, RouteClassName
from app.config.upstream import BackoffConfig, UpstreamConfig

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
    return [_problem(e) for e in err.errors()]


def _problem(error: Any) -> Problem:
    # A variable pydantic-settings could not decode arrives as a value error of the whole config, the
    # source's SettingsError in its context, and our EnvValueError (naming the variable) as that one's cause.
    cause = getattr(error.get("ctx", {}).get("error"), "__cause__", None)
    if isinstance(cause, EnvValueError):
        return Problem(cause.variable, cause.message)
    return Problem(_loc_to_path(error["loc"]), error["msg"].removeprefix("Value error, "))


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


def parse_config(raw: Mapping[str, Any]) -> GatewayConfig:
    """Validate a raw config mapping, with the process's `KVGATE_*` variables over it, or raise ConfigError
    with every problem."""
    try:
        cfg = GatewayConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_problems_from_validation(err)) from None
    problems = _semantic_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def load_config(path: str | Path | None = None) -> GatewayConfig:
    """Load a YAML config file (default: `KVGATE_CONFIG`, else the embedded `config/local.yaml`) and validate it,
    `KVGATE_*` variables over it."""
    chosen = Path(path or os.environ.get("KVGATE_CONFIG") or EMBEDDED_CONFIG)
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
    return parse_config(raw)
