"""Named detectors for volatile spans (dates, times, ids), compiled once, run as one regex scan."""

from __future__ import annotations

import re
from datetime import datetime

from app.config.normalize import RULES

# `learned` is not a detector: it names lines found by their `key=value` / `key: value` structure alone,
# which move only once the volatility memory has seen their values change (see `lines.parse_learned`).
# `section` names whole sections (tagged blocks, markdown sections, labelled blocks, fenced git snapshots:
# app/normalize/sections.py) that vary per session or per request; `reminder` a reminder part the client sends in
# its latest user turn only (app/normalize/transient.py). Neither is a line rule.
LEARNED = "learned"
TYPED_RULES = frozenset(RULES) - {LEARNED, "section", "reminder"}
ID_RULES = frozenset({"uuid", "hex_id", "prefixed_id"})

_MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)"
_MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December|"
    r"Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\.?"
)
_WDAY = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday|Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_HEX = r"[0-9a-fA-F]"

# One alternation, most specific first: at a given position the first alternative that matches wins,
# so "2026-11-30T10:00Z" is an iso_datetime, not a date followed by noise.
SPAN_RX = re.compile(
    rf"""
    (?P<iso_datetime>(?<![\w-])
        (?:\d{{4}}-[01]\d-[0-3]\d(?:T|[ ])[0-2]\d:[0-5]\d(?::[0-5]\d(?:[.,]\d{{1,9}})?)?
           (?:[ ]?(?:Z|UTC|[+-][0-2]\d:?[0-5]\d))?
         |\d{{8}}T\d{{6}}Z?)
        (?![\w:]))
    |(?P<rfc2822_datetime>(?<!\w)
        (?:{_WDAY},?[ ]+)?[0-3]?\d[ ]+{_MON}[ ]+\d{{4}}[ ]+[0-2]\d:[0-5]\d(?::[0-5]\d)?
        (?:[ ]+(?:[+-]\d{{4}}|GMT|UTC|UT|Z|[ECMP][SD]T))?
        (?![\w:]))
    |(?P<uuid>(?<![\w-]){_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}(?![\w-]))
    |(?P<date>(?<![\w/-])
        (?:\d{{4}}-[01]\d-[0-3]\d
         |[01]?\d/[0-3]?\d/(?:\d{{4}}|\d{{2}})
         |(?:{_WDAY},?[ ]+)?{_MONTH}[ ]+[0-3]?\d(?:st|nd|rd|th)?,?[ ]+\d{{4}}
         |(?:{_WDAY},?[ ]+)?[0-3]?\d(?:st|nd|rd|th)?[ ]+{_MONTH},?[ ]+\d{{4}})
        (?![\w/-]))
    |(?P<prefixed_id>(?<![\w-])
        (?:(?i:req|request|trace|span|sess|session|run|msg|conv|chatcmpl|call|evt|txn|corr|job|task
              |user|usr|cus|cust|acct|org|tenant|dev|thread)
             [_:-](?=[\w-]*\d)[A-Za-z0-9][\w-]{{5,63}}
         |(?i:session|trace|request|run)[ ]+(?:(?i:id)[ ]+)?(?=[\w-]*\d)[\w-]{{8,64}})
        (?![\w-]))
    |(?P<hex_id>(?<![\w-]){_HEX}{{16,64}}(?![\w-]))
    |(?P<epoch>(?<![\w.])1\d{{9}}(?:\d{{3}})?(?:\.\d{{1,6}})?(?![\w]|\.\d))
    """,
    re.VERBOSE,
)

# Labels whose value is "now" by definition (a static value under such a label is a contradiction).
NOW_LABEL_RX = re.compile(
    r"\b(?:current|now|today|today's|timestamp|datetime|as of|generated|request(?:ed)? (?:at|time)|"
    r"local time|server time|time)\b",
    re.IGNORECASE,
)
# Labels that name a per-request or per-session identifier.
ID_LABEL_RX = re.compile(
    r"\b(?:request|req|trace|span|session|sess|correlation|conversation|run|invocation|call|message|msg)\b",
    re.IGNORECASE,
)
# Labels of per-user/per-account identifiers: candidates (they differ between sessions), never presumed
# volatile at first sight (they are stable for one user), so only learning moves them.
ENTITY_LABEL_RX = re.compile(
    r"\b(?:user|usr|customer|client|account|acct|tenant|org|organi[sz]ation|device|workspace|thread)\b",
    re.IGNORECASE,
)
# Labels of content identifiers: moving these would change what the text is about (git SHAs, versions).
CONTENT_LABEL_RX = re.compile(
    r"\b(?:commit|sha|sha1|sha256|revision|rev|hash|checksum|digest|version|build|release|tag)\b",
    re.IGNORECASE,
)
# A date/time word in a label: enough for `labelled_datetime` when the value has no typed span.
TIME_LABEL_RX = re.compile(r"\b(?:date|time|timestamp|datetime|today|now|day)\b", re.IGNORECASE)

# What may surround spans in a metadata value: spaces, light punctuation, and a few short words
# (time zones, weekdays, "at"). Quotes, braces and backticks mean a payload, not a metadata value.
MAX_FILLER_WORDS = 3
FILLER_RX = re.compile(rf"[\s,;()|.*_]*(?:[A-Za-z][A-Za-z+\-]{{0,11}}[\s,;()|.*_]*){{0,{MAX_FILLER_WORDS}}}")
_DATE_WORDS_TEXT = (
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday "
    "sunday mon tue wed thu fri sat sun utc gmt ut z am pm est edt cst cdt mst mdt pst pdt cet cest"
)
DATE_WORDS = frozenset(_DATE_WORDS_TEXT.split())
OPAQUE_TOKEN_RX = re.compile(r"(?=[\w.:-]*\d)[A-Za-z0-9][\w.:-]{5,80}")

EPOCH_WINDOW_S = 30 * 86400


def span_ok(rule: str, text: str, now: datetime) -> bool:
    """Post-checks a regex cannot express cheaply: hex ids need letters and digits, epochs sit near now."""
    if rule == "hex_id":
        has_digit = any(c.isdigit() for c in text)
        has_alpha = any(c.isalpha() for c in text)
        return has_digit and has_alpha and (text.islower() or text.isupper())
    if rule == "epoch":
        value = float(text)
        if len(text.split(".")[0]) == 13:
            value /= 1000.0
        return abs(value - now.timestamp()) <= EPOCH_WINDOW_S
    return True
