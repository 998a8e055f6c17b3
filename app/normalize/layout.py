"""Where each volatile span goes: the very end of the input (per request) or the head of the first user turn
(per session, per day), or nowhere (never seen to vary, or the session already runs with it in place).

The moves are planned per session (`Variation.plan`): the first request of a session fixes which spans sit at
the head of its first user turn, and every later turn repeats that layout, so a session's prompt stays
append-only whatever the tenant learns meanwhile. A span seen to change *within* a session is per request and
goes to the tail on every turn (it breaks the prefix wherever it is; at the end it breaks nothing after it).
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple, Protocol

from app.normalize.rules import ID_RULES
from app.normalize.scan import Candidate
from app.normalize.sections import (
    declared_dirs,
    dir_forms,
    find_sections,
    holds_any,
    holds_git_state,
    is_reminder_block,
)
from app.normalize.varying import ACROSS, WITHIN, Variation

Place = Literal["tail", "head"]
SECTION = "section"  # the rule name of a moved section (tenants allow it in normalize_rules like the others)
# Labels of values that are constant within a session (an id of the session, its user, its workspace): per
# session when presumed. Any other presumed label ("Current time", "Request ID") names a per-request value.
_SESSION_LABEL_RX = re.compile(
    r"\b(?:session|sess|conversation|thread|user|usr|customer|client|account|acct|tenant|org|organi[sz]ation"
    r"|device|workspace)\b",
    re.IGNORECASE,
)


def line_place(c: Candidate, flags: int) -> Place:
    """Where a volatile line goes. A value seen changing within a session is per request; a date alone is per
    day (Codex's `<current_date>`, a "Today's date" line); a presumed one follows its label; one learned from
    changes between sessions only is per session; learned without session evidence (shared, evicted): tail."""
    if flags & WITHIN:
        return "tail"
    if c.rules and all(r == "date" for r in c.rules):
        return "head"
    if c.presume_volatile():
        session_label = c.label is not None and _SESSION_LABEL_RX.search(c.label) is not None
        return "head" if session_label and ID_RULES.intersection(c.rules) else "tail"
    return "head" if flags & ACROSS else "tail"


class Found(NamedTuple):
    """One section of a text: its bounds, learning key, value hash, and whether its name says it is the
    session's environment (hashes and offsets only: this is what the memory caches)."""

    start: int
    end: int
    key: int
    value: int
    named: bool


class TextSections(NamedTuple):
    """The sections of one text and where it declares working directories (offsets; cached per text hash)."""

    sections: tuple[Found, ...]
    dirs: tuple[tuple[int, int], ...]


def sections_of(text: str, slot: object, variation: Variation) -> TextSections:
    """The sections of `text` (in slot `slot`), found once per distinct text (a session repeats its texts)."""
    text_hash = hash((slot, text))
    cached = variation.cached_sections(text_hash)
    if isinstance(cached, TextSections):
        return cached
    found = tuple(
        Found(s.start, s.end, hash((slot, s.kind, s.name, s.nth)), hash(text[s.start : s.end]), s.named_session())
        for s in find_sections(text)
    )
    result = TextSections(found, declared_dirs(text) if found else ())
    variation.add_sections(text_hash, result)
    return result


def dir_needles(texts: list[tuple[str, TextSections]]) -> list[str]:
    """The working directories the texts declare, and their slugs (`sections.dir_forms`)."""
    paths: list[str] = []
    for text, found in texts:
        for a, b in found.dirs:
            if text[a:b] not in paths:
                paths.append(text[a:b])
    return dir_forms(paths)


def section_place(f: Found, text: str, dirs: list[str], flags: int) -> Place | None:
    """Where a section goes: per request to the tail; per session (named so, holding the session's working
    directory, or seen to change between sessions) to the head; otherwise it stays (None)."""
    if flags & WITHIN:
        return "tail"
    if f.named or flags & ACROSS or (dirs and holds_any(text, f.start, f.end, dirs)):
        return "head"
    return None


class ReminderFacts(Protocol):
    """What is known of a reminder text, memoized per tenant (app/normalize/transient.Transient)."""

    def plain(self, text: str) -> bool: ...

    def refers(self, text: str) -> bool: ...


def shared_preamble(parts: list[tuple[int, str, bool]], dirs: list[str], facts: ReminderFacts) -> tuple[int, ...]:
    """Which parts of the first user turn go before the head block, in order: the client's reminders that every
    session sends alike. Qwen Code opens that turn with reminders, [skills (6 KB), environment (cwd, date, folder
    tree), deferred tools (2.6 KB), date], then the user's words; with its skills and tools lists first, then the
    head block, a session in another directory recomputes neither.

    `parts` are the turn's text parts in order: (index in the content list, text, holds a volatile line). Only the
    leading run of whole reminder blocks is looked at. A reminder is shared when it holds no volatile line, no date,
    time or id (`facts`, memoized per text: Claude Code's `# currentDate` reminder is per day) and no working
    directory. A shared one moves ahead of a per-session one only when neither refers to the other by position
    ("the date above"). A pure function of the first user turn, which every request of a session repeats: the
    layout never moves."""
    lead: list[int] = []
    passed: list[str] = []  # the per-session reminders a later shared one would move ahead of
    for position, (index, text, volatile) in enumerate(parts):
        if index != position or not is_reminder_block(text):
            break
        shared = not volatile and not (dirs and holds_any(text, 0, len(text), dirs)) and facts.plain(text)
        if not shared:
            passed.append(text)
        elif not passed or not any(facts.refers(t) for t in (text, *passed)):
            lead.append(index)
    return tuple(lead)


def head_order(pieces: list[str]) -> list[str]:
    """The head block's pieces in the client's order, git status snapshots last: a git status changes far more often
    than the directory or the memory path, and what follows a changed piece is computed again."""
    return sorted(pieces, key=holds_git_state)
