"""cache_salt: valid for vLLM, deterministic, secret-dependent, distinct per tenant."""

from __future__ import annotations

import pytest

from app.normalize import cache_salt_for, salt_for_tenant
from tests.normalize.helpers import tenant


@pytest.mark.parametrize("tenant_id", ["acme", "a", "x" * 300, "t/with@odd\\chars", "ünïcode"])
def test_salt_passes_vllm_validation(tenant_id: str) -> None:
    salt = cache_salt_for(tenant_id, "s3cret")
    assert 0 < len(salt) <= 128
    assert not any(c in salt for c in "@/\\\x00")


def test_salt_is_deterministic_and_differs_per_tenant_and_secret() -> None:
    assert cache_salt_for("acme", "k1") == cache_salt_for("acme", "k1")
    assert cache_salt_for("acme", "k1") != cache_salt_for("globex", "k1")
    assert cache_salt_for("acme", "k1") != cache_salt_for("acme", "k2")


def test_salt_does_not_reveal_the_tenant_id() -> None:
    assert "acme" not in cache_salt_for("acme", "k1")


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        cache_salt_for("acme", "")


def test_shared_cache_tenants_get_no_salt() -> None:
    assert salt_for_tenant(tenant(shared_cache=True), "k") is None
    assert salt_for_tenant(tenant(), "k") == cache_salt_for("acme", "k")
