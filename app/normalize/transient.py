"""Reminders a client sends in its latest user turn only: learned from traffic, moved to the very end of the input.

Qwen Code 0.24.4 puts `<system-reminder>The current date is: …</system-reminder>` before the user's words in its
latest user turn, and drops it from that turn once a newer user turn follows. As sent, every new user turn breaks
the prefix where the previous turn's reminder was, and the previous turn's tool call, tool output and reply are
computed again (tests/fixtures/agents/qwen.jsonl: ~5k tokens a turn, 20 % of each turn-open request). At the very
end of the input the reminder breaks nothing after it, and the session is append-only again.

Learned per tenant from hashes only, with evidence of the drop: a user turn's other parts identify it (their
hash); when the turn that was the latest comes back as history without a reminder it held, that reminder's
*skeleton* (its text with dates, times and ids blanked, `rules.SPAN_RX`) is transient. A reminder once seen kept
in history (Claude Code's `# currentDate`, which stays in its first user turn) is never transient: the sticky
side is the one that leaves the body as sent. The first session of a tenant pays one turn before the evidence;
every later request moves it from the start.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from app.normalize.regions import refers_by_position
from app.normalize.rules import SPAN_RX
from app.normalize.sections import is_reminder_block

REMINDER = "reminder"  # the rule name of a moved reminder (tenants allow it in normalize_rules like the others)
_KEPT = False  # a skeleton seen kept in history: never transient
_DROPPED = True


class Transient:
    """One tenant's bounded tables (hashes only): the reminders each recent latest user turn held, and what is
    known of each reminder skeleton."""

    __slots__ = ("_capacity", "_held", "_known", "_skeletons")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        # hash of a reminder's text -> (its skeleton, whether it holds no date, time or id, whether it refers to one
        # by position): a 6 KB skills list is searched once, not on every request (SPAN_RX over it: ~1.5 ms)
        self._skeletons: OrderedDict[int, tuple[int, bool, bool]] = OrderedDict()
        # hash of a user turn's non-reminder texts -> the reminder skeletons it held when it was the latest
        self._held: OrderedDict[int, frozenset[int]] = OrderedDict()
        # reminder skeleton -> dropped (True) or kept (False) once the turn holding it became history
        self._known: OrderedDict[int, bool] = OrderedDict()

    def _put(self, table: OrderedDict[int, Any], key: int, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        if len(table) > self._capacity:
            table.popitem(last=False)

    def learn(self, held: int, now: frozenset[int]) -> None:
        """The turn identified by `held` is history now, holding the skeletons `now`: each reminder it held as the
        latest turn was dropped or kept."""
        before = self._held.get(held)
        if before is None:
            return
        for skeleton in before:
            if self._known.get(skeleton) is not _KEPT:
                self._put(self._known, skeleton, _DROPPED if skeleton not in now else _KEPT)

    def hold(self, turn: int, skeletons: frozenset[int]) -> None:
        """The latest user turn (identified by `turn`) holds these reminders."""
        self._put(self._held, turn, skeletons)

    def dropped(self, skeleton: int) -> bool:
        """Whether this reminder was seen dropped from history and never kept."""
        return self._known.get(skeleton) is _DROPPED

    def _facts(self, text: str) -> tuple[int, bool, bool]:
        key = hash(text)
        found = self._skeletons.get(key)
        if found is None:
            blanked, n = SPAN_RX.subn("", text)
            found = (hash(blanked), n == 0, refers_by_position(text))
            self._put(self._skeletons, key, found)
        return found

    def skeleton(self, text: str) -> int:
        """The hash of `text` with its dates, times and ids blanked (the same reminder on another day)."""
        return self._facts(text)[0]

    def plain(self, text: str) -> bool:
        """Whether `text` holds no date, time or id (a reminder every session and day could share)."""
        return self._facts(text)[1]

    def refers(self, text: str) -> bool:
        """Whether `text` refers to a date, time or id by position ("the date above": it must not move past it)."""
        return self._facts(text)[2]


def _turn_parts(msg: Any, part_type: str) -> list[tuple[int, str]] | None:
    """The (index, text) of a user turn's text parts, or None when it is no user turn with a content list."""
    if not isinstance(msg, dict) or msg.get("role") != "user":
        return None
    content = msg.get("content")
    if not isinstance(content, list):
        return None
    return [(j, p["text"]) for j, p in enumerate(content)
            if isinstance(p, dict) and p.get("type") == part_type and isinstance(p.get("text"), str)]


def _identity(parts: list[tuple[int, str]], memory: Transient) -> tuple[int | None, frozenset[int],
                                                                         list[tuple[int, int]]]:
    """A turn's identity (the hash of its non-reminder texts; None when it has none: nothing tells it from another
    turn), its reminder skeletons, and (index, skeleton) of each reminder part."""
    rest: list[str] = []
    reminders: list[tuple[int, int]] = []
    for j, text in parts:
        if is_reminder_block(text):
            reminders.append((j, memory.skeleton(text)))
        else:
            rest.append(text)
    return (hash(tuple(rest)) if rest else None), frozenset(s for _, s in reminders), reminders


def transient_parts(messages: Any, part_type: str, memory: Transient) -> tuple[int, tuple[int, ...]] | None:
    """Learn from this request, then say which parts of its latest user turn go to the tail: (the turn's index in
    `messages`, the parts' indices), or None. Looks at the last two user turns with text parts only (the turn that
    was the latest one request ago is the one before the latest now): the walk back to them passes the messages
    since, and every text it hashes or searches is memoized or bounded (`MAX_REMINDER_CHARS`)."""
    if not isinstance(messages, list):
        return None
    found: list[tuple[int, list[tuple[int, str]]]] = []
    for i in range(len(messages) - 1, -1, -1):
        parts = _turn_parts(messages[i], part_type)
        if parts:
            found.append((i, parts))
            if len(found) == 2:
                break
    if not found:
        return None
    if len(found) == 2:
        held, now, _ = _identity(found[1][1], memory)
        if held is not None:
            memory.learn(held, now)
    latest, parts = found[0]
    turn, skeletons, reminders = _identity(parts, memory)
    if not reminders or turn is None:
        return None
    memory.hold(turn, skeletons)
    moving = tuple(j for j, s in reminders if memory.dropped(s))
    return (latest, moving) if moving else None
