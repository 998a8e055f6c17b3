"""The latest whole request of each key the prefix memory tracks: its session's history, for a pre-warm.

A coding agent's session keeps one routing key (its stable prefix) while its history grows to tens of thousands
of tokens; when the key's rendezvous home moves to a joining replica, the session's next turn lands there and,
with only the prefix warm, prefills the whole history. So for each tracked key the newest request is kept as a
ready replay (the surface's `warm_history`: max_tokens 1, its salt replayed with it) and the warmer sends it in
place of the bare prefix. Bounded: an entry over `history_max_chars` is not kept (the key keeps the last one that
fit, still the start of its session), and the entries together stay within `history_budget_chars`, the least
recently updated forgotten first. The text lives only here, as the prefixes do: never logged, spanned or stored.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from app.api.surfaces.base import WarmRequest

Slot = tuple[str, str, int]  # (pool, tenant, routing key)


class Holder(Protocol):
    """What a history is attached to (memory.Prefix): the warmer reads it there."""

    history: WarmRequest | None


class HistoryBook:
    """Attaches histories to their holders within a per-entry cap and a total character budget."""

    def __init__(self, max_chars: int, budget_chars: int) -> None:
        self.max_chars = max_chars
        self.budget_chars = budget_chars
        self.chars = 0
        # Least recently updated first: the one forgotten when the budget is reached.
        self._held: OrderedDict[Slot, Holder] = OrderedDict()

    def keep(self, slot: Slot, holder: Holder, request: WarmRequest) -> None:
        """Make `request` `holder`'s history (replacing its last), then forget the oldest beyond the budget."""
        if request.chars > self.max_chars or request.chars > self.budget_chars:
            return  # the surfaces cap at max_chars already; the last one that fit stays
        self.forget(slot)
        holder.history = request
        self._held[slot] = holder
        self.chars += request.chars
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
