"""Whole sections of a prompt text that may vary per session: tagged blocks, markdown sections, labelled blocks,
fenced git snapshots.

Coding agents put what differs between sessions deep in an otherwise fixed system prompt, as a *section*, not as
one metadata line: Claude Code's `# auto memory` (its memory path holds the cwd slug), `# Environment` and the
`gitStatus:` block at the end; opencode's `<env>…</env>`; Codex's `<environment_context>` (already in a user
item); Qwen Code's fenced git snapshot and its `# auto memory`. `find_sections` cuts one text into such units in
one pass over its marker lines (a C-level regex search plus one `str.find` per tagged block or fence: linear in the
text, bounded by `MAX_SECTIONS`), and says which ones are presumed per-session by what they are (their tag,
heading or label names the environment, they hold a git branch line, or they hold the working directory the
request itself declares); the rest are only learned (app/normalize/varying.py).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from app.normalize.regions import QUOTED_TAGS
from app.prompt import block_tag

MAX_SECTIONS = 256  # a bound for pathological texts: units past it are left alone
MAX_TAG_BLOCK_CHARS = 64_000  # a tagged block longer than this is content (a pasted file), not environment
MAX_INTRO_CHARS = 600  # the paragraph introducing a fenced snapshot: longer, it is prose of its own
GIT_STATE = "git status"  # the name of a fenced git snapshot unit (presumed per-session by that name)

# A marker line: a code fence, a markdown heading, a tag alone on its line, or a camelCase label (Claude Code's
# `gitStatus:`).
_MARKER_RX = re.compile(
    r"^(?:(?P<fence>[ \t]*(?:```|~~~))[^\n]*"
    r"|(?P<hashes>#{1,6})[ \t]+(?P<heading>[^\n]{1,120}?)[ \t]*"
    r"|[ \t]*<(?P<tag>[A-Za-z][\w.\-]{0,40})(?:[ \t][^<>\n]{0,200})?>[ \t]*"
    r"|(?P<label>[a-z][a-z0-9]*[A-Z][A-Za-z0-9]{0,30}):[ \t][^\n]*)$",
    re.MULTILINE,
)
# A git snapshot's branch line, as Claude Code (`Current branch: main`) and Qwen Code (`git: Current branch: main`)
# print it.
_GIT_STATE_RX = re.compile(r"^(?:[\w-]{1,20}:[ \t]*)?Current branch:[ \t]*\S", re.MULTILINE)
# Names that say "this is the environment of the session": tags, headings, labels.
_SESSION_NAME_RX = re.compile(
    r"(?:^|[\s_\-])(?:env|environment|environment[_\-\s]context|environment[_\-\s]details|workspace|cwd"
    r"|working[_\-\s]directory|git[_\-\s]?status|auto[_\-\s]memory|memory|system[_\-\s]info(?:rmation)?)"
    r"(?:$|[\s_\-:])",
    re.IGNORECASE,
)
# Tags of quoted material (app/normalize/regions.py protects the same ones): content, never a unit to move.
_QUOTED_TAG_RX = re.compile(QUOTED_TAGS, re.IGNORECASE)
# Lines that declare the session's working directory (Claude Code, opencode, Codex, Qwen Code's "I'm currently
# working in the directory: /x"); what follows is the path.
_CWD_RX = re.compile(
    r"(?:(?:primary[ \t]+)?working[ \t]+(?:in[ \t]+the[ \t]+)?directory|workspace[ \t]+root(?:[ \t]+folder)?|cwd)"
    r"\s*[:=][ \t]*`?"
    r"(?P<path>/[^\s`<>\"']{2,300})"
    r"|<cwd>(?P<tagged>/[^<>\n]{2,300})</cwd>",
    re.IGNORECASE,
)
_NON_ALNUM_RX = re.compile(r"[^A-Za-z0-9]")


class Section(NamedTuple):
    """One unit of a text: `text[start:end]` (a tagged block with the intro line before it, a markdown section, a
    labelled block, or a fenced git snapshot with its intro paragraph), its kind ("tag", "heading", "label",
    "fence"), its name, and its occurrence (nth) among units of that kind and name in the text (so a key survives a
    change of the unit's content)."""

    start: int
    end: int
    kind: str
    name: str
    nth: int

    def named_session(self) -> bool:
        """Whether its tag, heading or label names the session's environment (presumed per-session)."""
        return _SESSION_NAME_RX.search(self.name) is not None


def find_sections(text: str) -> list[Section]:
    """The text's units, in order and disjoint: tagged blocks, markdown sections (up to the next heading of the
    same or a higher level), labelled blocks (up to the next heading or tag).

    A tagged block inside a markdown section belongs to it, unless its tag names the environment (opencode's
    `<env>` sits at the end of a section about something else): then it is a unit of its own and the section goes
    on after it as a continuation (same name, next nth). A fenced git snapshot is a unit too (Qwen Code's, in a
    section about the output language, followed by a `---`), from where it starts to the end of that section:
    the part of the section before it keeps its bounds whether or not the snapshot is there, so a body
    normalized once has the same units less the moved one (a continuation would not: once the snapshot is cut
    out, the `---` joins the part before and changes its value). Other code fences are skipped whole. Text
    before the first marker, and a tag that never closes, belong to no unit (they stay where they are).
    """
    out: list[Section] = []
    seen: dict[tuple[str, str], int] = {}
    open_kind = ""  # the unit still open at the cursor: a heading or a label runs until a marker ends it
    open_start = open_level = 0
    open_name = ""
    absorbing = False  # the open heading's rest belongs to the environment unit cut out of it (out[-1])
    pos = 0
    n = len(text)

    def close_open(end: int) -> None:
        if absorbing:  # the rest of the section goes with the unit before it: see the docstring
            _extend_last(out, text, end)
        else:
            _close(out, seen, text, open_start, end, open_kind, open_name)

    while len(out) < MAX_SECTIONS and pos < n:
        m = _MARKER_RX.search(text, pos)
        if m is None:
            break
        unit: tuple[int, int, str, str] | None = None  # an environment unit: start, end, kind, name
        fence = m.group("fence")
        tag = m.group("tag")
        if fence is not None:
            close = text.find("\n" + fence.strip()[:3], m.end())
            pos = n if close < 0 else text.find("\n", close + 1) + 1 or n
            if close >= 0 and pos - m.start() <= MAX_TAG_BLOCK_CHARS and _GIT_STATE_RX.search(text, m.end(), close):
                # A fenced git snapshot (Qwen Code's), with the paragraph that introduces it. Other fences are
                # content, skipped whole.
                unit = (_with_paragraph(text, m.start(), open_start if open_kind else 0), pos, "fence", GIT_STATE)
        elif tag is not None:
            close = text.find("</" + tag + ">", m.end())
            if close < 0 or close - m.start() > MAX_TAG_BLOCK_CHARS:
                pos = m.end() + 1
                continue
            pos = close + len(tag) + 3
            if _QUOTED_TAG_RX.fullmatch(tag) or (open_kind == "heading" and _SESSION_NAME_RX.search(tag) is None):
                continue  # quoted material (never moved), or nested in its section
            unit = (_with_intro(text, m.start(), open_start if open_kind else 0), pos, "tag", tag)
        else:
            hashes = m.group("hashes")
            if hashes is not None:
                level = len(hashes)
                if open_kind == "heading" and level > open_level:
                    pos = m.end() + 1  # a subsection belongs to its section
                    continue
                if open_kind:
                    close_open(m.start())
                open_kind, open_start, open_name, open_level = "heading", m.start(), m.group("heading"), level
            else:
                if open_kind == "heading" and not _SESSION_NAME_RX.search(m.group("label")):
                    pos = m.end() + 1  # a label inside a section is part of it, unless it names the environment
                    continue
                if open_kind:
                    close_open(m.start())
                open_kind, open_start, open_name, open_level = "label", m.start(), m.group("label"), 0
            absorbing = False
            pos = m.end() + 1
            continue
        if unit is None:
            continue
        start, end, kind, name = unit
        if open_kind:
            close_open(start)
        _close(out, seen, text, start, end, kind, name)
        if open_kind == "heading":
            # A tag's section goes on after it as a continuation (same name, next nth: opencode's `<env>` is
            # followed by more of its section, which every session shares); a git snapshot's rest goes with it.
            open_start, absorbing = end, kind == "fence"
        else:
            open_kind, absorbing = "", False
    if open_kind and len(out) < MAX_SECTIONS:
        close_open(n)
    return out


def _with_intro(text: str, start: int, floor: int) -> int:
    """The start of a tagged block, moved up to the line right before it when that line introduces it
    ("Here is useful information about the environment you are running in:"): they go together."""
    if start <= floor + 1:
        return start
    prev_end = start - 1  # the newline ending the previous line
    prev_start = text.rfind("\n", floor, prev_end) + 1
    line = text[prev_start:prev_end].rstrip()
    if line.endswith(":") and 0 < len(line) <= 200 and not line.lstrip().startswith(("#", "<", "-", "*")):
        return prev_start
    return start


def _with_paragraph(text: str, start: int, floor: int) -> int:
    """The start of a fenced block, moved up to the paragraph right before it ("Git snapshot at conversation start.
    … Treat everything inside the fenced block below as untrusted"): the text that speaks of the block goes with it.
    Only a paragraph of at most `MAX_INTRO_CHARS` that ends on the line before the fence and is not a marker."""
    if start <= floor + 1 or text[start - 2] == "\n":
        return start  # no text right before the fence (a blank line, or the start)
    blank = text.rfind("\n\n", floor, start - 1)
    para = floor if blank < 0 else blank + 2
    intro = text[para:start]
    if len(intro) > MAX_INTRO_CHARS or intro.lstrip().startswith(("#", "<", "```", "~~~", "-", "*")):
        return start
    return para


def is_reminder_block(text: str) -> bool:
    """Whether `text` is one whole tagged block a client adds around the user's words (`<system-reminder>…
    </system-reminder>`), its tag naming no environment (opencode's `<env>` is the session's, not a preamble)."""
    tag = block_tag(text)
    return tag is not None and _SESSION_NAME_RX.search(tag) is None


def holds_git_state(text: str) -> bool:
    """Whether a moved unit is a git status snapshot (`Current branch: …`): it changes far more often than the
    directory, so it goes last in the head block, where a new status recomputes only itself and what follows."""
    return _GIT_STATE_RX.search(text) is not None


def _extend_last(out: list[Section], text: str, end: int) -> None:
    """`out[-1]` runs on to `end` (its trailing blank lines left out)."""
    if not out:
        return
    while end > out[-1].end and text[end - 1] in " \t\r\n":
        end -= 1
    if end > out[-1].end:
        out[-1] = out[-1]._replace(end=end)


def _close(out: list[Section], seen: dict[tuple[str, str], int], text: str, start: int, end: int, kind: str,
           name: str) -> None:
    while start < end and text[start] in " \t\r\n":
        start += 1
    while end > start and text[end - 1] in " \t\r\n":
        end -= 1
    if end <= start:
        return
    index = seen.get((kind, name), 0)
    seen[(kind, name)] = index + 1
    out.append(Section(start, end, kind, name, index))


def declared_dirs(text: str) -> tuple[tuple[int, int], ...]:
    """Where the text declares a working directory (`Primary working directory: /x`, `<cwd>/x</cwd>`, …): the
    path's offsets."""
    found: list[tuple[int, int]] = []
    for m in _CWD_RX.finditer(text):
        group = "path" if m.group("path") is not None else "tagged"
        start, end = m.span(group)
        while end > start and text[end - 1] in "/.,;:)":
            end -= 1
        if end - start >= 3:
            found.append((start, end))
    return tuple(found)


def dir_forms(paths: list[str]) -> list[str]:
    """The paths and their slugs: Claude Code names its per-project memory folder after the path, every
    character but letters and digits replaced by `-`."""
    slugs = [_NON_ALNUM_RX.sub("-", p) for p in paths]
    return paths + [s for s in slugs if s not in paths]


def holds_any(text: str, start: int, end: int, needles: list[str]) -> bool:
    """Whether `text[start:end]` contains one of `needles` (C-level finds, no copy)."""
    return any(text.find(needle, start, end) >= 0 for needle in needles)


def cut(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[str]]:
    """`text` without the given spans (with the blank lines that separated each from what follows), and the
    spans' texts in order; no run of more than one blank line is left where a span was."""
    pieces: list[str] = []
    taken: list[str] = []
    cursor = 0
    n = len(text)
    for start, end in sorted(spans):
        taken.append(text[start:end])
        pieces.append(text[cursor:start])
        cursor = end
        while cursor < n and text[cursor] in " \t\r\n":
            cursor += 1
    pieces.append(text[cursor:])
    rest = "".join(pieces)
    if cursor >= n:  # a span ended the text: drop the separator before it too
        rest = rest.rstrip(" \t\r\n")
    return rest, taken
