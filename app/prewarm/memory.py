"""The stable prefixes each tenant sends most, per pool: what a joining replica is pre-warmed with.

A request's stable prefix is what every turn of its sessions repeats and what its routing key reads: on chat, the
leading system/developer messages, the tools, and the first user message (a prompt needs one; its blocks are the
last and the cheapest); Responses and Messages say theirs (each surface's `warm_request`), replayed on the surface
they came in on so vLLM renders them as it renders the session's turns. The text is kept only here, bounded
(per_tenant entries per pool and tenant, `tenants` tenants, prefixes up to max_prefix_chars), and never logged or
stored; with the request's cache_salt, so a replay fills the blocks that tenant's requests will look up. Counting
is "space saving" (Metwally et al.): a new prefix takes the least-seen slot of a full table and inherits its
count, so a steady favourite is never pushed out by a stream of one-off prefixes. Each tracked key also carries its
latest whole request when that is longer than its prefix (history.py: what a moved session's next turn reads).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.config.prewarm import PrewarmConfig
from app.prewarm.history import History, HistoryBook

if TYPE_CHECKING:
    from app.prompt import PromptView
    from app.surfaces.base import Surface, WarmRequest


@dataclass(slots=True)
class Prefix:
    """One remembered prefix: its routing key, the request that replays it, the surface it came in on, its salt,
    and the key's latest history when one is kept (history.py)."""

    key: int
    request: WarmRequest
    surface: Surface
    salt: str | None
    hits: int = 1
    history: History | None = None

    def replay(self) -> WarmRequest:
        """What fills the most of this key's blocks: its latest history (which starts with the prefix), if kept."""
        history = self.history
        request = history.replay() if history is not None else None
        return request if request is not None and request.chars > self.request.chars else self.request


class PrefixMemory:
    """Per (pool, tenant): the most-seen stable prefixes, keyed by routing key."""

    def __init__(self, cfg: PrewarmConfig) -> None:
        self.cfg = cfg
        # Least recently seen (pool, tenant) first: the one forgotten when `tenants` is reached.
        self._tables: OrderedDict[tuple[str, str], dict[int, Prefix]] = OrderedDict()
        self.histories = HistoryBook(cfg.history_max_chars, cfg.history_budget_chars) if cfg.histories else None

    def record(self, pool: str, tenant: str, key: int, body: Mapping[str, Any], salt: str | None,
               surface: Surface, view: PromptView | None = None) -> None:  # fmt: skip
        """Count one request of `tenant` routed to `pool` (its prefix is read only when its key is new) and keep it
        as its key's latest history, sized by its prompt `view` (the surface's view of `body` if not given)."""
        slot = (pool, tenant)
        table = self._tables.get(slot)
        entry = table.get(key) if table is not None else None
        if entry is not None:
            entry.hits += 1
            self._tables.move_to_end(slot)
            self._keep_history(pool, tenant, entry, body, surface, view)
            return
        request = surface.warm_request(body, self.cfg.max_prefix_chars)
        if request is None:
            return  # nothing to replay (a surface without a stable prefix, or too long): no table taken for it
        if table is None:
            table = self._tables[slot] = {}
            if len(self._tables) > self.cfg.tenants:
                (old_pool, old_tenant), old = self._tables.popitem(last=False)
                self._forget(old_pool, old_tenant, old.values())
        else:
            self._tables.move_to_end(slot)
        hits = 1
        if len(table) >= self.cfg.per_tenant:
            least = min(table.values(), key=lambda p: p.hits)
            del table[least.key]
            self._forget(pool, tenant, (least,))
            hits = least.hits + 1
        entry = table[key] = Prefix(key, request, surface, salt, hits)
        self._keep_history(pool, tenant, entry, body, surface, view)

    def _keep_history(self, pool: str, tenant: str, entry: Prefix, body: Mapping[str, Any], surface: Surface,
                      view: PromptView | None) -> None:  # fmt: skip
        # Only on the prefix's own surface (the replay renders as the key's requests do), and only what adds to it.
        if self.histories is None or surface is not entry.surface:
            return
        view = view or surface.view(body)
        chars = view.text_chars + view.tool_chars
        if chars > entry.request.chars:
            self.histories.keep((pool, tenant, entry.key), entry, History(body, surface, chars))

    def _forget(self, pool: str, tenant: str, entries: Iterable[Prefix]) -> None:
        if self.histories is not None:
            for entry in entries:
                self.histories.forget((pool, tenant, entry.key))

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
