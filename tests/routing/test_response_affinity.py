"""Stored-response routes: where a response lives and whose it is; another tenant's reads as unknown."""

from __future__ import annotations

import pytest

from app.errors import GatewayError
from app.routing.response_affinity import Holder, ResponseRoutes
from app.store.memory import MemoryStore


async def test_a_route_keeps_its_tenant_and_only_that_tenant_may_use_it() -> None:
    routes = ResponseRoutes(MemoryStore(), 60)
    await routes.remember("resp_1", Holder("main", "http://r1", "m", False, "acme"))
    held = await routes.recall("resp_1")
    assert ResponseRoutes.usable("resp_1", held, "acme").replica == "http://r1"
    with pytest.raises(GatewayError) as other:
        ResponseRoutes.usable("resp_1", held, "beta")
    with pytest.raises(GatewayError) as unknown:
        ResponseRoutes.usable("resp_2", await routes.recall("resp_2"), "beta")
    # The same answer as an unknown id: another tenant learns nothing of the response.
    assert (other.value.status, other.value.code) == (unknown.value.status, unknown.value.code) == (
        404, "response_not_found")


async def test_a_route_written_before_tenants_were_kept_is_nobodys() -> None:
    store = MemoryStore()
    await store.remember("resp:resp_old", "main\thttp://r1\tm\t", 60)
    held = await ResponseRoutes(store, 60).recall("resp_old")
    assert held is not None and held.tenant == ""
    with pytest.raises(GatewayError):
        ResponseRoutes.usable("resp_old", held, "acme")
