"""A config as a process with these `KVGATE_*` variables would load it: the variables set in os.environ for the
call (the real pydantic-settings source reads them), the shell's own KVGATE_* config variables hidden."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

from app.config import GatewayConfig, parse_config
from app.config.models import GatewayConfig as _Schema

# KVGATE_CONFIG and KVGATE_<KEY>... for every top-level key; KVGATE_FAST_PORT and the like (scripts) stay.
_CONFIG_VARIABLES = ("KVGATE_CONFIG", *(f"KVGATE_{k.upper()}" for k in _Schema.model_fields))


def is_config_variable(name: str) -> bool:
    """Whether the gateway's config reads this environment variable."""
    upper = name.upper()
    return any(upper == v or upper.startswith(f"{v}__") for v in _CONFIG_VARIABLES)


@contextmanager
def kvgate_environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ with exactly these config variables for the block."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if is_config_variable(n)]:
            mp.delenv(name)
        for name, value in env.items():
            mp.setenv(name, value)
        yield


def parse_with_env(raw: Mapping[str, Any], env: Mapping[str, str]) -> GatewayConfig:
    """parse_config(raw) under `env`."""
    with kvgate_environment(env):
        return parse_config(raw)
