"""Parse one line: is it a metadata line (label + value made of detected spans), and what are its spans."""

from __future__ import annotations

import re
from datetime import datetime
from typing import NamedTuple

from app.normalize.rules import (
    CONTENT_LABEL_RX,
    DATE_WORDS,
    ENTITY_LABEL_RX,
    FILLER_RX,
    ID_LABEL_RX,
    ID_RULES,
    LEARNED,
    MAX_FILLER_WORDS,
    NOW_LABEL_RX,
    OPAQUE_TOKEN_RX,
    SPAN_RX,
    TIME_LABEL_RX,
    TYPED_RULES,
    span_ok,
)

MAX_VALUE_CHARS = 120
MAX_LINE_CHARS = 200
MAX_LABEL_CHARS = 40
_LABEL_RX = re.compile(rf"[A-Za-z][A-Za-z _./()'\-]{{0,{MAX_LABEL_CHARS}}}")
_BULLETS = ("- ", "* ", "+ ", "\u2022 ")
_EMPHASIS = ("**", "__")
_PAYLOAD_CHARS = frozenset("\"'`{}[]<>")
_PRESUMABLE_TIME = frozenset({"iso_datetime", "rfc2822_datetime", "epoch", "labelled_datetime", "date"})

# Learned lines: `key=value` / `key: value` pairs, several per line separated by `;`, `,` or blanks
# (`x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=4f8a2;`). A value is one token:
# no blanks, separators, quotes, brackets or `=` (bar base64 padding), so prose and payloads never parse.
LEARNED_RULES: tuple[str, ...] = (LEARNED,)
MAX_PAIRS = 16
_VALUE = r"[^\s;,=\"'`{}\[\]<>]{1,64}={0,2}"
_KEY = r"[A-Za-z_][\w.\-]{0,39}"
_PAIR_SEP = r"(?:[ \t]*=[ \t]*|:[ \t]+)"  # `key: value` needs the blank: "10:30" and "https://x" are no pairs
_PAIR_RX = re.compile(rf"{_KEY}(?P<sep>{_PAIR_SEP})(?P<value>{_VALUE})")
_LIST_SEP = r"(?:[ \t]*[;,][ \t]*|[ \t]+)"
_PAIRS_RX = re.compile(
    rf"{_KEY}{_PAIR_SEP}{_VALUE}(?:{_LIST_SEP}{_KEY}{_PAIR_SEP}{_VALUE}){{0,{MAX_PAIRS - 1}}}[ \t]*[;,]?"
)
_TOKEN_RX = re.compile(rf"{_VALUE}")


class Line(NamedTuple):
    """A parsed metadata line: where it is, its rules and span texts, and its skeleton (spans blanked)."""

    start: int
    end: int
    rules: tuple[str, ...]
    skeleton: str
    values: tuple[str, ...]
    label: str | None
    value_start: int


def parse_line(
    text: str,
    line_start: int,
    line_end: int,
    allowed: frozenset[str],
    now: datetime,
) -> Line | None:
    """The line `text[line_start:line_end]` as a metadata line, or None if it is prose or a payload."""
    value_end = line_start + len(text[line_start:line_end].rstrip(" \t\r"))
    label: str | None
    tagged = _xml_field(text, line_start, value_end)
    if tagged is not None:
        label, value_start, value_end = tagged
    else:
        label, value_start = _split_label(text, line_start, line_end)
    if not 0 < value_end - value_start <= MAX_VALUE_CHARS:
        return None
    if label is None and SPAN_RX.match(text, value_start, value_end) is None:
        return None  # a whole-line value starts with its span; anything else is prose (one anchored match)
    if _wordy(text[value_start:value_end]):
        return None  # prose, not a metadata value: rejected before the span scan runs
    if label is not None and CONTENT_LABEL_RX.search(label):
        return None  # commit SHAs, versions, checksums: content, not request metadata
    return parse_value(text, line_start, line_end, label, value_start, value_end, allowed, now)


def parse_value(
    text: str,
    line_start: int,
    line_end: int,
    label: str | None,
    value_start: int,
    value_end: int,
    allowed: frozenset[str],
    now: datetime,
) -> Line | None:
    """The spans of a metadata value, if nothing but filler surrounds them."""
    whole = SPAN_RX.match(text, value_start, value_end)
    if whole is not None and whole.end() == value_end:  # the common case: the value is one span
        rule = whole.lastgroup or ""
        span_text = text[value_start:value_end]
        if rule not in allowed or not span_ok(rule, span_text, now):
            return None
        one = text[line_start:value_start] + "\x00" + rule  # what the general loop below would build
        return Line(line_start, line_end, (rule,), one, (span_text,), label, value_start)
    if text.find("=", value_start, value_end) >= 0 and not _may_label_only(label):
        # No span and no filler holds an `=`, so the loop below would fail; only `_labelled_only` could
        # take such a value, and it needs a time or id label. Skipping the span scan is worth ~40 µs on
        # a `k=v; k=v` line (the billing header), re-read on every request.
        return None
    spans = [(m.lastgroup or "", m.start(), m.end()) for m in SPAN_RX.finditer(text, value_start, value_end)]
    if not spans:
        return _labelled_only(text, line_start, line_end, label, value_start, value_end, allowed)
    rules: list[str] = []
    values: list[str] = []
    pieces: list[str] = []
    skeleton: list[str] = [text[line_start:value_start]]
    cursor = value_start
    for rule, s, e in spans:
        span_text = text[s:e]
        if rule not in allowed or not span_ok(rule, span_text, now):
            return None
        pieces.append(text[cursor:s])
        skeleton.extend((text[cursor:s], "\x00", rule))
        rules.append(rule)
        values.append(span_text)
        cursor = e
    pieces.append(text[cursor:value_end])
    skeleton.append(text[cursor:value_end])
    # The filler allows no quotes, braces or backticks: a span inside a payload fails here.
    if FILLER_RX.fullmatch(" ".join(pieces)) is None:
        return None
    return Line(line_start, line_end, tuple(rules), "".join(skeleton), tuple(values), label, value_start)


def parse_learned(text: str, line_start: int, line_end: int, allowed: frozenset[str]) -> Line | None:
    """The line as `key=value` / `key: value` pairs (or `Label: token`), rule `learned`, or None.

    Accepted shapes, after an optional indent and bullet: a list of pairs (`cch=4f8a2`, `a=1; b=x`,
    `Ticket: 5dd349`); a label, then such a list (`x-anthropic-billing-header: cc_version=2.1.3; cch=…;`);
    a label, then one token (`Ticket number: 5dd349`, `- **Nonce:** Zk81`). The line must name some value
    as machine-made: an `=` pair, or a value holding a digit ("Status: ok", "Mode: fast" are words).
    A content label (commit, version, …) alone on its line is content, not metadata; a typed span of a
    rule the tenant does not allow keeps the whole line out. The skeleton blanks every value, so the
    template key survives a change of any of them and the line moves as a whole.
    """
    if not _has_pair_separator(text, line_start, line_end):
        return None  # the common case (prose with a digit): two C-level finds, no regex
    i = line_start
    while i < line_end and text[i] in " \t":
        i += 1
    if text.startswith(_BULLETS, i, line_end):
        i += 2
        while i < line_end and text[i] in " \t":
            i += 1
    value_end = line_start + len(text[line_start:line_end].rstrip(" \t\r"))
    if i >= value_end:
        return None
    label: str | None = None
    if _PAIRS_RX.fullmatch(text, i, value_end) is not None:
        pairs_from = i
    else:
        label, value_start = _split_label(text, line_start, line_end)
        if label is None or CONTENT_LABEL_RX.search(label) or text[value_start - 1] == ":":
            return None  # no label, content, or `see https://x.com/a1` (a colon with no blank after it)
        if _PAIRS_RX.fullmatch(text, value_start, value_end) is not None:
            pairs_from = value_start
        elif value_start < value_end and _TOKEN_RX.fullmatch(text, value_start, value_end) is not None:
            value = text[value_start:value_end]
            if not any(c.isdigit() for c in value) or not _typed_spans_allowed(text, value_start, value_end, allowed):
                return None
            one = text[line_start:value_start] + "\x01"
            return Line(line_start, line_end, LEARNED_RULES, one, (value,), label, value_start)
        else:
            return None
    values: list[str] = []
    skeleton: list[str] = []
    cursor = line_start
    machine = False
    value_start = pairs_from
    for m in _PAIR_RX.finditer(text, pairs_from, value_end):
        s, e = m.span("value")
        value = text[s:e]
        if not values:
            value_start = s
        machine = machine or "=" in m.group("sep") or any(c.isdigit() for c in value)
        skeleton.extend((text[cursor:s], "\x01"))
        values.append(value)
        cursor = e
    if not values or not machine or not _typed_spans_allowed(text, pairs_from, value_end, allowed):
        return None
    skeleton.append(text[cursor:value_end])
    if label is None and len(values) == 1:
        label = text[pairs_from:value_start].rstrip(" \t:=")
        if CONTENT_LABEL_RX.search(label):
            return None  # `commit=3f2a9c1` alone on its line: content
    return Line(line_start, line_end, LEARNED_RULES, "".join(skeleton), tuple(values), label, value_start)


def _has_pair_separator(text: str, start: int, end: int) -> bool:
    """Whether the line holds an `=`, or a `:` followed by a blank or emphasis (every learnable line does)."""
    if text.find("=", start, end) >= 0:
        return True
    colon = text.find(":", start, end)
    while colon >= 0:
        if colon + 1 < end and text[colon + 1] in " \t*":  # `**Nonce:** Zk81` too
            return True
        colon = text.find(":", colon + 1, end)
    return False


def _typed_spans_allowed(text: str, start: int, end: int, allowed: frozenset[str]) -> bool:
    """False if a typed rule the tenant does not allow matches in the range (learning must not bypass it)."""
    if allowed >= TYPED_RULES:
        return True
    return all((m.lastgroup or "") in allowed for m in SPAN_RX.finditer(text, start, end))


def parse_any(text: str, line_start: int, line_end: int, allowed: frozenset[str], now: datetime) -> Line | None:
    """The line as a typed metadata line, else (when the tenant allows `learned`) as a learned one."""
    ln = parse_line(text, line_start, line_end, allowed, now)
    if ln is None and LEARNED in allowed:
        ln = parse_learned(text, line_start, line_end, allowed)
    return ln


def _may_label_only(label: str | None) -> bool:
    """Whether `_labelled_only` could accept a value under this label (a time, id or entity label)."""
    if label is None:
        return False
    return bool(TIME_LABEL_RX.search(label) or ID_LABEL_RX.search(label) or ENTITY_LABEL_RX.search(label))


def _labelled_only(
    text: str,
    line_start: int,
    line_end: int,
    label: str | None,
    value_start: int,
    value_end: int,
    allowed: frozenset[str],
) -> Line | None:
    """A labelled line whose value no typed rule matched: a free-form time, or an opaque session token."""
    if label is None:
        return None
    value = text[value_start:value_end]
    if not any(c.isdigit() for c in value) or any(c in _PAYLOAD_CHARS for c in value):
        return None
    skeleton = text[line_start:value_start]
    if "labelled_datetime" in allowed and TIME_LABEL_RX.search(label):
        if len(value) > 64 or value.count(" ") > 7:
            return None
        return Line(line_start, line_end, ("labelled_datetime",), skeleton, (value,), label, value_start)
    id_label = ID_LABEL_RX.search(label) or ENTITY_LABEL_RX.search(label)
    if "prefixed_id" in allowed and id_label and OPAQUE_TOKEN_RX.fullmatch(value):
        return Line(line_start, line_end, ("prefixed_id",), skeleton, (value,), label, value_start)
    return None


def _xml_field(text: str, start: int, end: int) -> tuple[str, int, int] | None:
    """`<tag>value</tag>` alone on a line (Codex's <environment_context> fields): label, value start and end."""
    i = start
    while i < end and text[i] in " \t":
        i += 1
    if not text.startswith("<", i, end) or not text.endswith(">", i, end):
        return None
    close = text.find(">", i + 1, end)
    tag = text[i + 1 : close]
    if close < 0 or not 0 < len(tag) <= MAX_LABEL_CHARS or not _XML_TAG_RX.fullmatch(tag):
        return None
    closing = "</" + tag + ">"
    if not text.endswith(closing, close + 1, end) or end - len(closing) <= close + 1:
        return None
    return tag.replace("_", " "), close + 1, end - len(closing)


_XML_TAG_RX = re.compile(r"[A-Za-z][A-Za-z0-9_\-]*")


def _split_label(text: str, start: int, end: int) -> tuple[str | None, int]:
    """Split `[indent][bullet][**]Label[**]: value` with plain string ops (a regex here costs ~5 µs/line)."""
    i = start
    while i < end and text[i] in " \t":
        i += 1
    if text.startswith(_BULLETS, i, end):
        i += 2
        while i < end and text[i] in " \t":
            i += 1
    value_start = i
    if text.startswith(_EMPHASIS, i, end):
        i += 2
    window = min(end, i + MAX_LABEL_CHARS + 6)
    colon = text.find(":", i, window)
    equals = text.find("=", i, window)
    sep = colon if equals < 0 or 0 <= colon < equals else equals
    if sep < 0:
        return None, value_start
    label = text[i:sep].rstrip(" \t")
    if label.endswith(_EMPHASIS):
        label = label[:-2].rstrip(" \t")
    if not _LABEL_RX.fullmatch(label):
        return None, value_start
    j = sep + 1
    if text.startswith(_EMPHASIS, j, end):
        j += 2
    while j < end and text[j] in " \t":
        j += 1
    return label, j


def _wordy(value: str) -> bool:
    """More plain words than a metadata value carries (time zones, weekdays, months and am/pm excepted)."""
    words = 0
    for token in value.split():
        word = token.strip(",.;:()|*_!?").lower()
        if word.isalpha() and word not in DATE_WORDS:
            words += 1
            if words > MAX_FILLER_WORDS + 1:
                return True
    return False


def presume(label: str | None, rules: tuple[str, ...]) -> bool:
    """Volatile at first sight? Only a typed value under a label that names "now" or a per-request id.

    Such a label says the value is per request by definition; waiting for a second sighting would cost
    the first requests of every tenant their whole prefix, while a wrong presumption only restates a
    static line at the tail (same facts, later). Unlabelled values and plain labels ("Date:", as in
    few-shot examples) must be seen to change first.
    """
    if label is None:
        return False
    if ID_RULES.intersection(rules) and ID_LABEL_RX.search(label):
        return True
    return bool(_PRESUMABLE_TIME.intersection(rules)) and NOW_LABEL_RX.search(label) is not None
