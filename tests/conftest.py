"""Fixtures shared by the fast tier: a fake upstream and a gateway in front of it, on real sockets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from app.api.app import create_app
from app.config import GatewayConfig, parse_config
from kvlab.configs import gateway_config as lab_config
from tests.config_env import kvgate_environment
from tests.servers import FakeUpstream, serve_in_thread

pytest_plugins = ["tests.store.redis_fixtures"]

PUBLIC_MODEL = "public-model"

# Properties are about values, not speed: on a loaded 2-core machine one example may take seconds.
settings.register_profile("kvgate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvgate")


@pytest.fixture(autouse=True)
def _no_config_variables_from_the_shell() -> Iterator[None]:
    """Each test's config is its own: KVGATE_* config variables of the shell running pytest are hidden."""
    with kvgate_environment({}):
        yield


def gateway_config(replicas: list[str], **overrides: Any) -> GatewayConfig:
    """A one-model, one-pool config in front of `replicas`, anonymous access; overrides merge at top level."""
    raw = lab_config(
        {"main": {"role": "interactive", "replicas": replicas, "policy": "round_robin"}},
        model=PUBLIC_MODEL, served_model="served-model",
        upstream={"connect_timeout_s": 1, "read_timeout_s": 2, "max_body_bytes": 65536, "retries": 2},
        routing={"probe_interval_s": 0.2, "healthy_after": 1, "unhealthy_after": 1},
    )
    raw.update(overrides)
    return parse_config(raw)


@contextmanager
def running_gateway(cfg: GatewayConfig) -> Iterator[str]:
    """The gateway app on a free loopback port; yields its base URL."""
    with serve_in_thread(create_app(cfg)) as url:
        yield url


@pytest.fixture
def fake_upstream() -> Iterator[tuple[FakeUpstream, str]]:
    """One fake upstream replica and its URL."""
    fake = FakeUpstream()
    with serve_in_thread(fake.app()) as url:
        yield fake, url


@pytest.fixture
def gateway(fake_upstream: tuple[FakeUpstream, str]) -> Iterator[str]:
    """A gateway in front of the fake upstream."""
    _, url = fake_upstream
    with running_gateway(gateway_config([url])) as gw:
        yield gw


@pytest.fixture
def stack() -> Iterator[Callable[..., str]]:
    """Start gateways on demand (closed at teardown): stack(cfg) -> base URL."""
    with ExitStack() as es:
        yield lambda cfg: es.enter_context(running_gateway(cfg))
