"""Find movable metadata lines in the head of one message text, with their template and value hashes."""

from __future__ import annotations

import re
from datetime import datetime
from hashlib import blake2b
from typing import NamedTuple

from app.normalize.lines import (
    LEARNED_RULES,
    MAX_LINE_CHARS,
    Line,
    parse_any,
    parse_learned,
    parse_line,
    parse_value,
    presume,
)
from app.normalize.memory import LearnedKey, Shape, TenantMemory
from app.normalize.regions import in_ranges, protected_ranges, refers_by_position
from app.normalize.rules import LEARNED

# Only the head of a message is scanned (this many static characters): a volatile line there costs
# every block after it, and the scan stays O(1) per message however long the prompt is.
HEAD_CHARS = 2048
_NEIGHBOUR_STEPS = 256  # a bound for pathological runs of blank/metadata lines
# Every typed span holds a digit; a learned line holds a digit or an `=`: one C-level search per such
# line finds them all.
_DIGIT_LINE_RX = re.compile(r"\d[^\n]*")
_LEARNABLE_LINE_RX = re.compile(r"[\d=][^\n]*")


def _line_rx(allowed: frozenset[str]) -> re.Pattern[str]:
    return _LEARNABLE_LINE_RX if LEARNED in allowed else _DIGIT_LINE_RX


def fingerprint(fp_key: bytes, learned: bool, slot: object, skeleton: str, prev_line: str, next_line: str) -> int:
    """A template key every process computes alike: keyed BLAKE2b-64 of the line's kind, slot, skeleton, neighbours.

    Python's `hash` of a str differs per process (PYTHONHASHSEED), so it cannot name a template across gateway
    replicas; this can, and with the tenant's `fp_key` (derived from the salt secret) a reader of the store
    cannot confirm a guessed prompt, nor see that two tenants share one. Computed once per template and
    process: the shape cache carries the keys on the fast path, and `TenantMemory` caches them by local hash.
    """
    data = "\0".join(("L" if learned else "T", repr(slot), skeleton, prev_line, next_line))
    digest = blake2b(data.encode("utf-8", "surrogatepass"), digest_size=8, key=fp_key).digest()
    return int.from_bytes(digest, "big")


class Candidate(NamedTuple):
    """One metadata line that may move: its place in the text, the rule of each span, and its hashes."""

    start: int
    end: int  # end of the line's text, newline excluded
    rules: tuple[str, ...]
    key: int  # hash of where the line sits: slot, line with spans blanked out, static neighbours
    value: int  # hash of the span texts
    label: str | None
    skeleton: str
    value_start: int

    def presume_volatile(self) -> bool:
        """Whether to count this line volatile before it has been seen to change (see `lines.presume`)."""
        return presume(self.label, self.rules)


def find_candidates(
    text: str,
    slot: object,
    allowed: frozenset[str],
    now: datetime,
    memory: TenantMemory | None = None,
    fp_key: bytes = b"",
    keys: TenantMemory | None = None,
) -> list[Candidate]:
    """Metadata lines in the head of `text` whose spans all match allowed rules (outside protected parts).

    The head is measured in static characters (newlines and metadata lines not counted), so moving
    lines out never pulls new lines into it: that keeps normalization idempotent. With `memory`,
    paragraphs already found to hold no metadata are skipped by hash: static prompt text is the same
    on every request, so the steady-state cost is one hash per head paragraph plus the parse of the
    lines that do change.
    """
    parsed_lines: list[Line] = []
    budget = HEAD_CHARS
    para_start = 0
    n = len(text)
    while para_start < n and budget > 0:
        para_end = text.find("\n\n", para_start)
        para_end = n if para_end < 0 else para_end
        para_hash = 0
        if memory is not None:
            para_hash = hash(text[para_start:para_end])
            if memory.is_static_text(para_hash, allowed):
                budget -= para_end - para_start - text.count("\n", para_start, para_end)
                para_start = para_end + 2
                continue
        found, budget = _scan_paragraph(text, para_start, para_end, allowed, now, parsed_lines, budget)
        if not found and budget > 0 and memory is not None:  # only a fully scanned paragraph is cached
            memory.add_static_text(para_hash, allowed)
        para_start = para_end + 2
    if not parsed_lines:
        return []
    # Only text up to the last parsed line can open a block that encloses it.
    ranges = protected_ranges(text[: max(ln.end for ln in parsed_lines)])
    lines = [ln for ln in parsed_lines if not in_ranges(ln.start, ranges)]
    if not lines:
        return []
    return _keyed(text, slot, lines, fp_key, keys)


def _keyed(text: str, slot: object, lines: list[Line], fp_key: bytes, keys: TenantMemory | None) -> list[Candidate]:
    """Candidates with their template key (`fingerprint` of slot, skeleton, static neighbours) and value hash.

    A learned line with a single pair and no static line around it in its text is dropped (it stays as
    static text): nothing but its own label says it is a template, and it may be a user's whole message.
    Learned keys are `LearnedKey`s, which the memory holds to a stricter standard of evidence.
    """
    neighbours = _neighbours(text, lines)
    lone = [
        i
        for i, ln in enumerate(lines)
        if ln.rules is LEARNED_RULES and len(ln.values) == 1 and neighbours[i] == ("", "")
    ]
    if lone:
        dropped = set(lone)
        lines = [ln for i, ln in enumerate(lines) if i not in dropped]
        neighbours = _neighbours(text, lines)
    out = []
    for ln, (prev_line, next_line) in zip(lines, neighbours, strict=True):
        learned = ln.rules is LEARNED_RULES
        if keys is None:
            key = fingerprint(fp_key, learned, slot, ln.skeleton, prev_line, next_line)
        else:  # a dict lookup by the process's own hash instead of a BLAKE2b per line (short texts: every request)
            local = hash((learned, slot, ln.skeleton, prev_line, next_line))
            found = keys.known_fingerprint(local)
            if found is None:
                found = fingerprint(keys.fingerprint_key, learned, slot, ln.skeleton, prev_line, next_line)
                keys.add_fingerprint(local, found)
            key = found
        if learned:
            key = LearnedKey(key)
        out.append(Candidate(ln.start, ln.end, ln.rules, key, hash(ln.values), ln.label, ln.skeleton, ln.value_start))
    return out


def _neighbours(text: str, lines: list[Line]) -> list[tuple[str, str]]:
    """Each line's nearest static (non-candidate, non-blank) line before and after it."""
    starts = {ln.start for ln in lines}
    return [
        (_neighbour(text, ln.start, starts, backwards=True), _neighbour(text, ln.end, starts, backwards=False))
        for ln in lines
    ]


class Scan(NamedTuple):
    """What `scan_text` found: candidates, the text without them (and them verbatim), positional answer."""

    candidates: list[Candidate]
    rest: str
    lines: list[str]
    refers: bool


_SMALL_TEXT = 512  # below this, caching costs more than it saves


def scan_text(text: str, slot: object, allowed: frozenset[str], now: datetime, memory: TenantMemory) -> Scan:
    """Candidates in `text`, the text without them, and whether that rest refers to a span by position.

    Fast path: the tenant's last request in this slot left a shape (which lines were metadata, their
    keys, and a hash of everything else). If those lines still parse as metadata with the same
    skeletons and the rest hashes the same, the rest is byte-identical to a text already scanned: the
    full scan, the key computation and the positional search are skipped. In steady state (the same
    template with new values) this is the common case.
    """
    if len(text) < _SMALL_TEXT:
        if _line_rx(allowed).search(text) is None:
            return Scan([], text, [], refers_by_position(text))
        candidates = find_candidates(text, slot, allowed, now, keys=memory)
        rest, lines = remove_spans(text, [(c.start, c.end) for c in candidates])
        return Scan(candidates, rest, lines, refers_by_position(rest))
    slot_key = hash(slot)
    shape = memory.shape(slot_key, allowed)
    if shape is not None:
        found = _reparse(text, shape, allowed, now)
        if found is not None:
            rest, lines = remove_spans(text, [(c.start, c.end) for c in found])
            if hash(rest) == shape.rest_hash:
                return Scan(found, rest, lines, shape.refers)
    candidates = find_candidates(text, slot, allowed, now, memory, keys=memory)
    rest, lines = remove_spans(text, [(c.start, c.end) for c in candidates])
    rest_hash = hash(rest)
    refers = memory.positional(rest_hash)
    if refers is None:
        refers = refers_by_position(rest)
        memory.add_positional(rest_hash, refers)
    prefix_lens = tuple(c.value_start - c.start for c in candidates)
    memory.add_shape(
        slot_key,
        Shape(
            line_indices=tuple(text.count("\n", 0, c.start) for c in candidates),
            prefix_lens=prefix_lens,
            prefix_hashes=tuple(hash(text[c.start : c.value_start]) for c in candidates),
            keys=tuple(c.key for c in candidates),
            skeletons=tuple(hash(c.skeleton) for c in candidates),
            rest_hash=rest_hash,
            refers=refers,
        ),
        allowed,
    )
    return Scan(candidates, rest, lines, refers)


def _reparse(text: str, shape: Shape, allowed: frozenset[str], now: datetime) -> list[Candidate] | None:
    """Re-parse the shape's lines; None unless each is still metadata with the same skeleton.

    A line whose text up to its value is unchanged (checked by hash) skips the label split and the
    prose filter: only its value is re-read.
    """
    out: list[Candidate] = []
    index = 0
    pos = 0
    n = len(text)
    for target, prefix_len, prefix_hash, key, skeleton_hash in zip(
        shape.line_indices, shape.prefix_lens, shape.prefix_hashes, shape.keys, shape.skeletons, strict=True
    ):
        while index < target:
            newline = text.find("\n", pos)
            if newline < 0:
                return None
            pos = newline + 1
            index += 1
        end = text.find("\n", pos)
        end = n if end < 0 else end
        if end - pos > MAX_LINE_CHARS:
            return None
        value_start = pos + prefix_len
        ln = None
        if type(key) is LearnedKey:  # typed first, as the full scan does: a new value may now be typed
            ln = parse_any(text, pos, end, allowed, now)
        elif value_start < end and hash(text[pos:value_start]) == prefix_hash:
            value_end = pos + len(text[pos:end].rstrip(" \t\r"))
            ln = parse_value(text, pos, end, None, value_start, value_end, allowed, now)
        if ln is None and type(key) is not LearnedKey:  # new label, or a label-only rule: the full parse
            ln = parse_line(text, pos, end, allowed, now)
        if ln is None or hash(ln.skeleton) != skeleton_hash:
            return None
        # Same skeleton and (checked by the caller) same rest: same neighbours, so the same key.
        out.append(Candidate(ln.start, ln.end, ln.rules, key, hash(ln.values), ln.label, ln.skeleton, ln.value_start))
    return out


def remove_spans(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[str]]:
    """`text` without the given lines (each with its newline), and those lines verbatim, in order.

    Lines removed from the very top take the blank lines after them along, so the text does not
    start with an empty line.
    """
    if not spans:
        return text, []
    pieces: list[str] = []
    lines: list[str] = []
    cursor = 0
    at_top = True
    n = len(text)
    for start, end in sorted(spans):
        lines.append(text[start:end])
        kept = text[cursor:start] if end < n else text[cursor : max(start - 1, cursor)]
        if kept:
            at_top = False
            pieces.append(kept)
        cursor = end + 1 if end < n else end
        if at_top:
            while cursor < n and text[cursor] in "\r\n":
                cursor += 1
    pieces.append(text[cursor:])
    return "".join(pieces), lines


def _scan_paragraph(
    text: str, start: int, end: int, allowed: frozenset[str], now: datetime, out: list[Line], budget: int
) -> tuple[bool, int]:
    """Parse the lines of one paragraph that may be metadata (a digit, or an `=` when learning) into `out`
    while static characters remain in the head budget; whether any was metadata, and the budget left."""
    found = False
    pos = start
    line_rx = _line_rx(allowed)
    learn = LEARNED in allowed
    while True:
        m = line_rx.search(text, pos, end)
        if m is None:
            return found, budget - (end - pos - text.count("\n", pos, end))
        line_end = m.end()
        line_start = text.rfind("\n", 0, m.start()) + 1
        budget -= line_start - pos - text.count("\n", pos, line_start)
        if budget <= 0:
            return found, budget
        parsed = None
        if line_end - line_start <= MAX_LINE_CHARS:
            parsed = parse_line(text, line_start, line_end, allowed, now)
            if parsed is None and learn:
                parsed = parse_learned(text, line_start, line_end, allowed)
        if parsed is None:
            budget -= line_end - line_start
        else:
            out.append(parsed)
            found = True
        pos = line_end + 1
        if pos >= end:
            return found, budget


def _neighbour(text: str, pos: int, skip: set[int], *, backwards: bool) -> str:
    """The nearest non-blank line before/after `pos` that is not itself a candidate ("" at the edge)."""
    for _ in range(_NEIGHBOUR_STEPS):
        if backwards:
            if pos <= 0:
                return ""
            end = pos - 1
            start = text.rfind("\n", 0, end) + 1
            pos = start
        else:
            if pos >= len(text):
                return ""
            start = pos + 1
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
            pos = end
        if start not in skip and text[start:end].strip():
            return text[start:end]
    return ""
