"""Real-Redis fixtures come from tests/store/redis_fixtures.py, registered as a plugin in tests/conftest.py.

The Redis-client tests run on both event loops: `kvgate serve` runs uvloop, pytest's default is asyncio,
and their transports differ (uvloop's do not subclass asyncio.Transport).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

BOTH_LOOPS = ("test_resp.py", "test_redis_store.py")


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """asyncio and uvloop for the Redis client tests; the default loop for the rest."""
    if item.path.name in BOTH_LOOPS:
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}
