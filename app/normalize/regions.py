"""Where normalization must not act: code fences, JSON payloads, quoted documents, positional references."""

from __future__ import annotations

import re

# Block openers at line start. Tag names are the ones prompts use for quoted material (retrieved
# documents, few-shot examples, files) plus our own restated block, which must never be moved again.
QUOTED_TAGS = (
    "document|documents|doc|context|quote|example|examples|few_shot|sample|file|source|search_results?|retrieved"
    "|data|json|code|transcript|request_metadata"
)
_MARKER_RX = re.compile(
    r"^[ \t]*(?:(?P<fence>```|~~~|\"\"\")|(?P<quote>>)|(?P<json>[{\[])"
    rf"|<(?P<tag>{QUOTED_TAGS})\b[^>\n]*>)",
    re.MULTILINE | re.IGNORECASE,
)
# A date/time/id referred to by where it sits. Only position words, not temporal ones ("previous",
# "earlier"), and only nouns that name a span: "the request below" or "the tools below" do not count.
_SPAN_NOUN = r"(?:date|time|timestamp|datetime|id|ids|identifier|uuid|epoch)"
_POSITIONAL_RX = re.compile(
    rf"\b(?:{_SPAN_NOUN}s?\W+(?:\w+\W+){{0,2}}?(?:above|below)"
    rf"|(?:above|below|aforementioned|preceding)\W+(?:\w+\W+){{0,2}}?{_SPAN_NOUN})\b",
    re.IGNORECASE,
)
_POSITION_WORDS = ("above", "below", "Above", "Below", "aforementioned", "preceding")


def protected_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges of `text` that hold code, JSON, quoted or restated material (end exclusive)."""
    ranges: list[tuple[int, int]] = []
    pos = 0
    n = len(text)
    while True:
        m = _MARKER_RX.search(text, pos)
        if m is None:
            return ranges
        start = m.start()
        line_end = text.find("\n", m.end())
        line_end = n if line_end < 0 else line_end
        if m.group("fence"):
            end = _find_fence_close(text, m.group("fence"), line_end)
        elif m.group("quote"):
            end = line_end
        elif m.group("json"):
            end = _json_end(text, start)
        else:
            closing = re.compile(rf"</{m.group('tag')}\b", re.IGNORECASE).search(text, m.end())
            end = n if closing is None else closing.end()
        ranges.append((start, end))
        pos = max(end, line_end, start + 1)
        if pos >= n:
            return ranges


def _find_fence_close(text: str, fence: str, after: int) -> int:
    i = after
    while True:
        j = text.find(fence, i)
        if j < 0:
            return len(text)
        line_start = text.rfind("\n", 0, j) + 1
        if not text[line_start:j].strip():
            end = text.find("\n", j)
            return len(text) if end < 0 else end
        i = j + len(fence)


def _json_end(text: str, start: int) -> int:
    depth = 0
    pos = start
    n = len(text)
    while pos < n:
        end = text.find("\n", pos)
        end = n if end < 0 else end
        line = text[pos:end]
        depth += line.count("{") + line.count("[") - line.count("}") - line.count("]")
        if depth <= 0:
            return end
        pos = end + 1
    return n


def in_ranges(pos: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether `pos` falls inside one of `ranges`."""
    return any(a <= pos < b for a, b in ranges)


def refers_by_position(text: str) -> bool:
    """Whether the text refers to a date/time/id by position ("the date above"): then nothing may move."""
    for word in _POSITION_WORDS:  # cheap C-level scans first; the regex runs only near a hit
        if word in text:
            return _POSITIONAL_RX.search(text) is not None
    return False
