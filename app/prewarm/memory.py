"""The stable prefixes each tenant sends most, per pool: what a joining replica is pre-warmed with.

A chat request's stable prefix is what every turn of its sessions repeats and what its routing key reads: the
leading system/developer messages, the tools, and the first user message (a prompt needs one; its blocks are the
last and the cheapest). The text is kept only here, bounded (per_tenant entries per pool and tenant, `tenants`
tenants, prefixes up to max_prefix_chars), and never logged or stored; with the request's cache_salt, so a replay
fills the blocks that tenant's requests will look up. Counting is "space saving" (Metwally et al.): a new prefix
takes the least-seen slot of a full table and inherits its count, so a steady favourite is never pushed out by a
stream of one-off prefixes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from app.prewarm.config import PrewarmConfig
from app.prompt import content_chars

_LEADING_ROLES = frozenset({"system", "developer"})
# Fields that reach the chat template, so the replayed prompt renders to the same leading tokens.
RENDER_FIELDS = ("tools", "tool_choice", "chat_template", "chat_template_kwargs", "documents")


@dataclass(slots=True)
class Prefix:
    """One remembered prefix: its routing key, the replay body (without model and max_tokens), its salt."""

    key: int
    body: dict[str, Any]
    salt: str | None
    hits: int = 1


def stable_prefix(body: Mapping[str, Any], max_chars: int) -> dict[str, Any] | None:
    """The replay body of a chat request's stable prefix, or None (no user message, or longer than max_chars)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    head: list[Any] = []
    for msg in messages:
        role = msg.get("role") if isinstance(msg, dict) else None
        if role in _LEADING_ROLES or role == "user":
            head.append(msg)
        if role not in _LEADING_ROLES:
            break
    if not head or head[-1].get("role") != "user":
        return None
    out: dict[str, Any] = {"messages": head}
    size = sum(content_chars(m.get("content")) for m in head)
    for name in RENDER_FIELDS:
        if body.get(name) is not None:
            out[name] = body[name]
            if name == "tools":
                size += len(orjson.dumps(body[name]))
    return out if size <= max_chars else None


class PrefixMemory:
    """Per (pool, tenant): the most-seen stable prefixes, keyed by routing key."""

    def __init__(self, cfg: PrewarmConfig) -> None:
        self.cfg = cfg
        # Least recently seen (pool, tenant) first: the one forgotten when `tenants` is reached.
        self._tables: OrderedDict[tuple[str, str], dict[int, Prefix]] = OrderedDict()

    def record(self, pool: str, tenant: str, key: int, body: Mapping[str, Any], salt: str | None) -> None:
        """Count one request of `tenant` routed to `pool` (the body is read only when its key is new)."""
        slot = (pool, tenant)
        table = self._tables.get(slot)
        if table is None:
            table = self._tables[slot] = {}
            if len(self._tables) > self.cfg.tenants:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(slot)
        entry = table.get(key)
        if entry is not None:
            entry.hits += 1
            return
        prefix = stable_prefix(body, self.cfg.max_prefix_chars)
        if prefix is None:
            return
        hits = 1
        if len(table) >= self.cfg.per_tenant:
            least = min(table.values(), key=lambda p: p.hits)
            del table[least.key]
            hits = least.hits + 1
        table[key] = Prefix(key, prefix, salt, hits)

    def top(self, pool: str) -> list[Prefix]:
        """`pool`'s prefixes, every tenant's most seen first, then every tenant's second, and so on."""
        ranked = [sorted(t.values(), key=lambda p: -p.hits) for (p, _), t in self._tables.items() if p == pool]
        out: list[Prefix] = []
        for rank in range(max((len(r) for r in ranked), default=0)):
            out.extend(sorted((r[rank] for r in ranked if rank < len(r)), key=lambda p: -p.hits))
        return out

    def size(self) -> int:
        """Prefixes held over all pools and tenants."""
        return sum(len(t) for t in self._tables.values())
