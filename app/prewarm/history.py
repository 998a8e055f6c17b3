"""The latest whole request of each key the prefix memory tracks: its session's history, for a pre-warm.

A coding agent's session keeps one routing key (its stable prefix) while its history grows to tens of thousands
of tokens; when the key's rendezvous home moves to a joining replica, the session's next turn lands there and,
with only the prefix warm, prefills the whole history. So for each tracked key the newest request is kept, and
the warmer sends it (the surface's `warm_history`: max_tokens 1, its salt replayed with it) in place of the bare
prefix. Bounded: an entry over `history_max_chars` is not kept (the key keeps the last one that fit, still the
start of its session), and the entries together stay within `history_budget_chars`, the least recently updated
forgotten first. The text lives only here, as the prefixes do: never logged, spanned or stored.

Kept by reference, sized by the characters the request's prompt view already counted, and turned into a replay
only when a pre-warm sends it: on a 300-message agent turn, building the replay on every request cost 47 µs (chat)
and 67 µs (Messages) per request, on the path before the reply's first byte; keeping the reference costs 0.9 µs
(0.2 µs with histories off; experiments/prewarm_record_micro.py, 2026-12-01).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from app.surfaces.base import Surface, WarmRequest

Slot = tuple[str, str, int]  # (pool, tenant, routing key)


@dataclass(frozen=True, slots=True)
class History:
    """A key's latest whole request (the parsed body, not a copy) and its size in prompt characters."""

    body: Mapping[str, Any]
    surface: Surface
    chars: int

    def replay(self) -> WarmRequest | None:
        """The request that caches it (None where its surface replays no history, e.g. a stored Responses turn)."""
        return self.surface.warm_history(self.body, sys.maxsize)  # the cap was checked on `chars` when kept


class Holder(Protocol):
    """What a history is attached to (memory.Prefix): the warmer reads it there."""

    history: History | None


class HistoryBook:
    """Attaches histories to their holders within a per-entry cap and a total character budget."""

    def __init__(self, max_chars: int, budget_chars: int) -> None:
        self.max_chars = max_chars
        self.budget_chars = budget_chars
        self.chars = 0
        # Least recently updated first: the one forgotten when the budget is reached.
        self._held: OrderedDict[Slot, Holder] = OrderedDict()

    def keep(self, slot: Slot, holder: Holder, history: History) -> None:
        """Make `history` `holder`'s (replacing its last), then forget the oldest beyond the budget."""
        if history.chars > self.max_chars or history.chars > self.budget_chars:
            return  # the last one that fit stays
        self.forget(slot)
        holder.history = history
        self._held[slot] = holder
        self.chars += history.chars
        while self.chars > self.budget_chars:
            _, oldest = self._held.popitem(last=False)
            self._drop(oldest)

    def forget(self, slot: Slot) -> None:
        """Drop `slot`'s history (its key left the memory, or a newer one replaces it)."""
        holder = self._held.pop(slot, None)
        if holder is not None:
            self._drop(holder)

    def _drop(self, holder: Holder) -> None:
        if holder.history is not None:
            self.chars -= holder.history.chars
            holder.history = None

    def __len__(self) -> int:
        return len(self._held)
