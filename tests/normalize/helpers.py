"""Builders for normalize tests: tenants, models, agent-like requests with a volatile header."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from app.config import ModelConfig
from app.context import NormalizeReport, Operation, Tenant
from app.normalize import VolatilityMemory, normalize
from app.surfaces import CHAT, COMPLETIONS, EMBEDDINGS, Surface

NOW = datetime(2026, 11, 30, 1, 0, 0, tzinfo=UTC)

STATIC_SYSTEM = (
    "You are Acme's support agent. Answer briefly and cite the order number when you use one.\n"
    "\n"
    "## Rules\n"
    "- Refunds are allowed within 30 days of delivery.\n"
    "- Never reveal internal notes.\n"
    "- Escalate to a human after 3 failed attempts.\n"
    "\n"
    "## Example\n"
    "Date: 2024-01-05\n"
    "User: where is order 1234?\n"
    "Assistant: Order 1234 shipped on 2024-01-03.\n"
    "\n"
    "```python\n"
    "commit = '3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39'\n"
    "created: 2026-11-30T01:00:00Z\n"
    "```\n"
)


def tenant(mode: Literal["off", "observe", "on"] = "on", rules: frozenset[str] | None = None, **kw: Any) -> Tenant:
    """A tenant with the given normalize mode and allowed rules."""
    return Tenant(id=kw.pop("id", "acme"), normalize=mode, normalize_rules=rules, **kw)


def model(placement: Literal["system", "user"] = "system", inserts_date: bool = False) -> ModelConfig:
    """A public model config with the given tail placement."""
    return ModelConfig(name="m", pools=["fast"], tail_placement=placement, template_inserts_date=inserts_date)


def header(i: int) -> str:
    """A volatile header: a timestamp, a request id and a session uuid that change per request."""
    t = NOW + timedelta(seconds=61 * i)
    rid = uuid.UUID(int=(i * 7919) % (1 << 64) | (1 << 70)).hex[:12]
    sid = uuid.UUID(int=(i * 104729 + 17) | (1 << 90))
    return f"Current time: {t.isoformat()}\nRequest ID: req_{rid}\nSession: {sid}\n\n"


def chat_body(system: str, user: str = "Where is my order?", **extra: Any) -> dict[str, Any]:
    """A chat request with one system and one user message."""
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        **extra,
    }


def run(
    body: dict[str, Any],
    *,
    memory: VolatilityMemory,
    mode: Literal["off", "observe", "on"] = "on",
    operation: Operation = "chat",
    placement: Literal["system", "user"] = "system",
    rules: frozenset[str] | None = None,
    opt_out: bool = False,
    inserts_date: bool = False,
    now: datetime = NOW,
) -> tuple[dict[str, Any], NormalizeReport]:
    """Call `normalize` with test defaults."""
    surfaces: dict[str, Surface] = {"chat": CHAT, "text_completion": COMPLETIONS, "embeddings": EMBEDDINGS}
    return normalize(
        body,
        surface=surfaces[operation],
        tenant=tenant(mode, rules),
        model=model(placement, inserts_date),
        memory=memory,
        opt_out=opt_out,
        now=now,
    )
