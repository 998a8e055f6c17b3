"""How a span varies, learned per tenant from hashes: between sessions, within one, or never; and each session's plan.

Where a volatile span may go depends on how it varies. A value that changes on every request (a nonce, a
timestamp) belongs at the very end of the input, after everything the next request repeats. A value constant
within a session but different between sessions (a working directory, a git status, a memory path, a date)
belongs at the head of the first user message: there it never moves between turns, and the system prompt and
tools before it become one prefix shared by every session. `Variation.observe` tells them apart by the session
that sent each value; `plan`/`set_plan` pin, per session, which spans went to the head on its first request, so
a span learned later does not move in the middle of a running session (that would re-prefill its history).

Hashes only, LRU-bounded; in-process (a restart re-learns; sessions started before it keep their own layout
only if the same spans are still classified alike, which presumed ones always are).
"""

from __future__ import annotations

from collections import OrderedDict

ACROSS = 1  # the value was seen to change between two sessions
WITHIN = 2  # the value was seen to change within one session: per request
# A section is per request only after its text changed this many times in a row within one session.
SECTION_WITHIN_AFTER = 2
# A span seen in this many new sessions in a row with the same value counts as constant again (a learned
# variation that settled); presumed spans do not depend on it.
RELAX_AFTER_SESSIONS = 16
_PLAN_FACTOR = 8  # sessions with a plan kept per tenant, per span-table entry


class Variation:
    """One tenant's span variation table and session plans. Obtain via `TenantMemory.variation`."""

    __slots__ = ("_capacity", "_plans", "_sections", "_spans")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        # span key -> [last value hash, session of the last sighting, flags, same-value sessions in a row,
        #              changes within a session in a row]
        self._spans: OrderedDict[int, list[int]] = OrderedDict()
        # session key -> (span keys placed at the head of its first user turn, span keys decided at all)
        self._plans: OrderedDict[int, tuple[set[int], set[int]]] = OrderedDict()
        # text hash -> the sections found in it (keys, value hashes, bounds): a session repeats its texts
        self._sections: OrderedDict[int, object] = OrderedDict()

    def observe(self, key: int, value: int, session: int, within_after: int = 1) -> int:
        """Record one sighting of the span `key` with value hash `value` from `session`; its flags so far.

        WITHIN needs `within_after` changes in a row inside one session (a section's text changing once is a
        prompt edit, not a per-request value); ACROSS needs one change between sessions.
        """
        entry = self._spans.get(key)
        if entry is None:
            self._spans[key] = [value, session, 0, 0, 0]
            if len(self._spans) > self._capacity:
                self._spans.popitem(last=False)
            return 0
        self._spans.move_to_end(key)
        if entry[0] != value:
            if entry[1] == session:
                entry[4] += 1
                if entry[4] >= within_after:
                    entry[2] |= WITHIN
            else:
                entry[2] |= ACROSS
                entry[4] = 0
            entry[0] = value
            entry[3] = 0
        elif entry[1] != session:
            entry[3] += 1
            if entry[3] >= RELAX_AFTER_SESSIONS and not entry[2] & WITHIN:
                entry[2] = 0
                entry[3] = 0
        else:
            entry[4] = 0
        entry[1] = session
        return entry[2]

    def flags(self, key: int) -> int:
        """The span's flags (0 if unknown); does not learn."""
        entry = self._spans.get(key)
        return 0 if entry is None else entry[2]

    def plan(self, session: int) -> tuple[set[int], set[int]]:
        """The session's layout, created empty on its first request: the span keys placed at the head of its first
        user turn, and every span key decided for it (a span decided once is placed alike on every later turn;
        one the session never showed before, such as a new template, is decided when it first appears). Updated in
        place by the caller; bounded (the least recently used session is dropped)."""
        found = self._plans.get(session)
        if found is not None:
            self._plans.move_to_end(session)
            return found
        found = (set(), set())
        self._plans[session] = found
        if len(self._plans) > _PLAN_FACTOR * self._capacity:
            self._plans.popitem(last=False)
        return found

    def cached_sections(self, text_hash: int) -> object | None:
        """What `add_sections` stored for a text with this hash."""
        return self._sections.get(text_hash)

    def add_sections(self, text_hash: int, found: object) -> None:
        """Cache the sections of one text (bounded like the shape cache)."""
        self._sections[text_hash] = found
        if len(self._sections) > 64:
            self._sections.popitem(last=False)
