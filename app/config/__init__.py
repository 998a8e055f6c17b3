"""The gateway's configuration: the schema (one model per block, each key described) and its loading.

The bottom of the package graph: it imports no other part of app/, so every stage and feature can read its
own block of the config without a circle.
"""

from app.config.loader import (
    EMBEDDED_CONFIG,
    AuthConfig,
    BackoffConfig,
    BreakerSettings,
    ConfigError,
    GatewayConfig,
    LimitsConfig,
    Listen,
    ModelConfig,
    NormalizeConfig,
    NormalizeMode,
    PoolConfig,
    PriceConfig,
    Problem,
    ReferencePrice,
    RouteClassName,
    RoutingConfig,
    SpillSettings,
    StoreConfig,
    TelemetryConfig,
    TenantConfig,
    UpstreamConfig,
    load_config,
    parse_config,
)

__all__ = [
    "EMBEDDED_CONFIG", "AuthConfig", "BackoffConfig", "BreakerSettings", "ConfigError", "GatewayConfig",
    "LimitsConfig", "Listen", "ModelConfig", "NormalizeConfig", "NormalizeMode", "PoolConfig", "PriceConfig",
    "Problem", "ReferencePrice", "RouteClassName", "RoutingConfig", "SpillSettings", "StoreConfig",
    "TelemetryConfig", "TenantConfig", "UpstreamConfig", "load_config", "parse_config",
]
