"""What the fault tests share: two sims that fail a marked body, a gateway with two tenants in front of them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app.config import GatewayConfig
from app.sim.testing import running_sim
from tests.conftest import PUBLIC_MODEL, gateway_config

MARKER = "POISON-7d1f"  # a body that carries it is answered 500 by every sim (app/sim/faults.py)
ATTACKER, VICTIM = "sk-attacker", "sk-victim"
TENANTS = [{"id": "attacker", "api_keys": [ATTACKER]}, {"id": "victim", "api_keys": [VICTIM]}]


@contextmanager
def poisonable_sims(n: int = 2, **options: Any) -> Iterator[list[str]]:
    """`n` in-thread sims serving "served-model" that answer a MARKER body with a 500."""
    with running_sim(model="served-model", fail_marker=MARKER, **options) as a:
        if n == 1:
            yield [a]
            return
        with running_sim(model="served-model", fail_marker=MARKER, **options) as b:
            yield [a, b]


def two_tenants(replicas: list[str], **overrides: Any) -> GatewayConfig:
    """The test gateway's config with keys required and the attacker and victim tenants."""
    return gateway_config(replicas, **{"tenants": TENANTS, "auth": {"required": True}, **overrides})


def chat(text: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    """A small chat body."""
    return {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **extra}


def messages(text: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    """A small Anthropic Messages body."""
    return {"model": PUBLIC_MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}],
            **extra}  # fmt: skip


def poisoned(i: int) -> tuple[str, dict[str, Any]]:
    """The i-th of the poisoned requests, in turn: count_tokens asking for a stream, a chat body and a Messages
    body the engine fails deterministically, the Messages one streamed."""
    kind = i % 4
    if kind == 0:
        return "/v1/messages/count_tokens", {**messages(f"count {i}"), "stream": True}
    if kind == 1:
        return "/v1/chat/completions", chat(f"{MARKER} {i}")
    if kind == 2:
        return "/v1/messages", messages(f"{MARKER} {i}")
    return "/v1/messages", messages(f"{MARKER} {i}", stream=True)
