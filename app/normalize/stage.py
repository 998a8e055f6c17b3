"""The normalize stage: per-request spans to the tail, per-session sections and lines to the head of the first
user turn, canonical tools, a pinned date."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from app.config import ModelConfig
from app.context import NormalizeReport, Tenant
from app.normalize.hoist import hoist, hoisted, system_turns_after
from app.normalize.layout import (
    SECTION,
    Found,
    Place,
    ReminderFacts,
    TextSections,
    dir_needles,
    head_order,
    line_place,
    section_place,
    sections_of,
    shared_preamble,
)
from app.normalize.memory import TenantMemory, VolatilityMemory
from app.normalize.regions import refers_by_position
from app.normalize.rules import RULES
from app.normalize.scan import Candidate, Scan, remove_spans, scan_text
from app.normalize.sections import cut
from app.normalize.session import session_key
from app.normalize.tools import ToolOrder, canonicalize_tools
from app.normalize.transient import REMINDER, transient_parts
from app.normalize.varying import SECTION_WITHIN_AFTER, Variation
from app.prompt import PromptView, TextSlot, with_text
from app.surfaces.placement import at_head

if TYPE_CHECKING:
    from app.surfaces.base import Surface

_ALL_RULES = frozenset(RULES)
_ALL_LINE_RULES = _ALL_RULES - {SECTION, REMINDER}  # what `_learn` scans for when the tenant allows every rule
# The reports of a request left as it came, shared (frozen; nothing mutates a report): most requests get one.
_OFF = NormalizeReport(mode="off")
_ON_UNCHANGED = NormalizeReport(mode="on")


class _Text:
    """One scanned text of the prompt head, and the spans that will move out of it (lines and sections)."""

    __slots__ = ("first_user", "moving", "places", "scan", "sections", "slot", "values")

    def __init__(self, slot: TextSlot, first_user: bool) -> None:
        self.slot = slot
        self.first_user = first_user  # part of the first user turn (not a leading system/developer text)
        self.moving: list[Candidate] = []
        self.places: list[Place] = []  # where each moving line goes, in the order of `moving`
        self.sections: list[tuple[Found, Place]] = []
        self.scan: Scan | None = None
        self.values: dict[int, int] = {}  # candidate key -> value hash (of all its lines when several share it)

    @property
    def text(self) -> str:
        """The slot's text as the client sent it."""
        return self.slot.text

    def removed(self) -> tuple[str, list[tuple[str, Place]]]:
        """The text without its moving spans, and those spans verbatim with where each goes, in text order."""
        if not self.sections:
            if self.scan is not None and len(self.moving) == len(self.scan.candidates):
                rest, lines = self.scan.rest, self.scan.lines
            else:
                rest, lines = remove_spans(self.text, [(c.start, c.end) for c in self.moving])
            return rest, list(zip(lines, self.places, strict=True))
        spans = [(c.start, c.end, p) for c, p in zip(self.moving, self.places, strict=True)]
        spans.extend((f.start, f.end, p) for f, p in self.sections)
        spans.sort()
        rest, taken = cut(self.text, [(a, b) for a, b, _ in spans])
        return rest, [(piece, p) for piece, (_, _, p) in zip(taken, spans, strict=True)]


def normalize(
    body: dict[str, Any],
    *,
    surface: Surface,
    view: PromptView | None = None,
    tenant: Tenant,
    model: ModelConfig,
    memory: VolatilityMemory,
    opt_out: bool,
    now: datetime | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], NormalizeReport]:
    """Rewrite a request for a stable prefix (mode "on"), or only report what would change ("observe").

    Pure except for `memory`, which learns span volatility in place (observe mode learns too, so
    switching a tenant on starts warm). "off", the per-request opt-out and surfaces that are never
    normalized (embeddings) return `body` itself untouched and teach nothing. Observe never modifies
    `body`; "on" returns a new dict that shares every sub-object it did not change. `view` is the
    surface's view of `body` (built here when not given); `headers` name the session (app/normalize/session).
    `now` is the UTC time when not given (read only past the early return: most tenants normalize nothing).
    """
    mode = tenant.normalize
    if mode == "off" or opt_out or not surface.normalizable:
        return body, _OFF
    if now is None:
        now = datetime.now(UTC)
    allowed = _ALL_RULES if tenant.normalize_rules is None else _ALL_RULES & tenant.normalize_rules
    if view is None:
        view = surface.view(body)
    first = view.first_user
    texts = [_Text(slot, first is not None and slot.path[: len(first)] == first) for slot in view.head]
    moved: dict[str, int] = {}
    to_head = 0
    dirs: list[str] = []  # the working directories the head texts declare, and their slugs
    # the latest user turn's transient reminders: the body's key of its turns, the turn's index, the parts' indices
    reminders: tuple[str, int, tuple[int, ...]] | None = None
    tenant_memory: TenantMemory | None = None
    lifted: list[int] = []  # system turns after the first user message that go before it (app/normalize/hoist)
    if allowed and texts:
        tenant_memory = memory.for_tenant(tenant.id)
        _learn(texts, _ALL_LINE_RULES if allowed is _ALL_RULES else allowed - {SECTION, REMINDER}, tenant_memory, now)
        variation = tenant_memory.variation
        found = _found(texts, allowed, variation)
        at = first[1] if first is not None and first[0] == "messages" else None
        turns = system_turns_after(body.get("messages"), at) if SECTION in allowed and isinstance(at, int) else []
        # The session and its plan only when something could be placed or hoisted (most requests: nothing). A plan
        # is empty until a span is decided for it, so one made on a later request holds what an earlier one would.
        if found is not None or turns:
            session = session_key(headers, body, view)
            plan = variation.plan(session)
            if found is not None:
                dirs = _place(texts, found, variation, session, plan, head_ok=first is not None)
            if turns and isinstance(at, int):
                lifted = hoisted(body["messages"], at, turns, variation, session, plan)
        tail_ok = model.tail_placement == "system" or view.restatable
        if REMINDER in allowed and tail_ok and first is not None:
            turns_key = str(first[0])  # "messages" or "input": where the first user turn is, the others are
            found_parts = transient_parts(body.get(turns_key), view.part_type, tenant_memory.transient)
            if found_parts is not None:
                reminders = (turns_key, *found_parts)
        any_moving = reminders is not None
        for t in texts if not any_moving else ():
            if t.moving or t.sections:
                any_moving = True
                break
        # Whether anything goes to the tail is asked only when something moves (most requests: nothing does).
        blocked = any_moving and (
            (any("tail" in t.places or any(p == "tail" for _, p in t.sections) for t in texts) and not tail_ok)
            or _refers_by_position(texts, view.tail_refs)
        )
        if blocked:
            lifted, reminders = [], None
            for t in texts:
                t.moving, t.places, t.sections = [], [], []
        else:
            if reminders is not None:
                moved[REMINDER] = len(reminders[2])
            if lifted:
                moved[SECTION] = moved.get(SECTION, 0) + len(lifted)
            for t in texts if any_moving else ():
                for c, p in zip(t.moving, t.places, strict=True):
                    to_head += p == "head"
                    for rule in c.rules:
                        moved[rule] = moved.get(rule, 0) + 1
                for _, p in t.sections:
                    to_head += p == "head"
                    moved[SECTION] = moved.get(SECTION, 0) + 1

    tools = body.get("tools") if surface.has_tools else None
    new_tools, tools_changed = (tools, 0)
    if isinstance(tools, list) and tools:
        new_tools, tools_changed = canonicalize_tools(tools, _tool_order(model))

    date_string = _date_to_pin(body, surface, model, now)

    if mode == "observe":
        return body, NormalizeReport(
            mode="observe", moved=moved, tools_canonicalized=tools_changed, date_pinned=date_string is not None,
            to_head=to_head,
        )
    if not moved and not tools_changed and date_string is None:
        return body, _ON_UNCHANGED

    if moved:
        assert tenant_memory is not None  # spans move only when the block above ran
        out = _apply_moves(body, texts, surface, model, view, dirs, reminders, tenant_memory.transient)
    else:
        out = dict(body)
    if lifted and first is not None and isinstance(first[1], int):
        out = hoist(out, first[1], lifted)  # last: the moves above address messages by their index
    if tools_changed:
        out["tools"] = new_tools
    if date_string is not None:
        kwargs = body.get("chat_template_kwargs")
        out["chat_template_kwargs"] = {**(kwargs if isinstance(kwargs, dict) else {}), "date_string": date_string}
    return out, NormalizeReport(
        mode="on",
        moved=moved,
        tools_canonicalized=tools_changed,
        date_pinned=date_string is not None,
        applied=True,
        to_head=to_head,
    )


def _learn(texts: list[_Text], allowed: frozenset[str], memory: TenantMemory, now: datetime) -> None:
    """Find candidates in every scanned text, teach the memory, keep the ones known to be volatile.

    Lines that share a key inside one text (same skeleton, same neighbours) are one unit: observed
    once with the hash of all their values, moved together or not at all. Observing them one by one
    would let a request contradict itself and make the outcome depend on line order.
    """
    if not allowed:
        return
    for t in texts:
        t.scan = scan_text(t.text, (t.slot.turn, t.slot.part), allowed, now, memory)
        groups: dict[int, list[Candidate]] = {}
        for c in t.scan.candidates:
            groups.setdefault(c.key, []).append(c)
        for key, group in groups.items():
            value = group[0].value if len(group) == 1 else hash(tuple(c.value for c in group))
            t.values[key] = value
            presume = memory.peek(key) is None and any(c.presume_volatile() for c in group)
            if memory.observe(key, value, presume):
                t.moving.extend(group)
        if len(groups) < len(t.scan.candidates):
            t.moving.sort(key=lambda c: c.start)


def _found(texts: list[_Text], allowed: frozenset[str], variation: Variation) -> list[TextSections | None] | None:
    """Each text's sections (None per text when the tenant does not allow `section`), or None when no text holds a
    section or a candidate line: then nothing is to be placed."""
    per_text: list[TextSections | None] = (
        [sections_of(t.text, (t.slot.turn, t.slot.part), variation) for t in texts] if SECTION in allowed
        else [None] * len(texts)
    )
    # Loops, not any() over generators: this runs for every normalized request, and most find nothing.
    for f in per_text:
        if f is not None and f.sections:
            return per_text
    for t in texts:
        if t.scan is not None and t.scan.candidates:
            return per_text
    return None


def _place(texts: list[_Text], per_text: list[TextSections | None], variation: Variation, session: int,
           plan: tuple[set[int], set[int]], *, head_ok: bool) -> list[str]:
    """Decide where each volatile line and section goes (`layout`), under the session's plan; returns the working
    directories the texts declare (and their slugs).

    Sections are found in every text when the tenant allows `section`; a line inside a moving section moves
    with it. What would go to the head stays where it is when it is already in the first user turn, when the
    request has no user turn, or when the session first showed it while it was not yet known to vary (the plan:
    a span moves to the head on every turn of a session or on none).
    """
    heads, decided = plan
    dirs = dir_needles([(t.text, f) for t, f in zip(texts, per_text, strict=True) if f is not None])

    def at_head_ok(key: int, place: Place | None) -> bool:
        """Whether a span of a leading text goes to the head; records the session's first decision on it."""
        if key not in decided:
            decided.add(key)
            if place == "head" and head_ok:
                heads.add(key)
        return key in heads

    for t, found in zip(texts, per_text, strict=True):
        spans: list[tuple[int, int]] = []
        if found is not None:
            candidates = t.scan.candidates if t.scan is not None else []
            for f in found.sections:
                value = _value_without_lines(t.text, f, candidates)
                place = section_place(f, t.text, dirs, variation.observe(f.key, value, session, SECTION_WITHIN_AFTER))
                if place == "head" and (t.first_user or not at_head_ok(f.key, place)):
                    continue
                if place is None:
                    if not t.first_user:
                        at_head_ok(f.key, None)
                    continue
                t.sections.append((f, place))
                spans.append((f.start, f.end))
        moving = {id(c) for c in t.moving}
        flags = {key: variation.observe(key, value, session) for key, value in t.values.items()}
        keep: list[Candidate] = []
        for c in t.scan.candidates if t.scan is not None else ():
            if any(a <= c.start < b for a, b in spans):
                continue  # its section carries it
            if id(c) not in moving:
                if not t.first_user:
                    at_head_ok(c.key, None)
                continue
            place = line_place(c, flags[c.key])
            if place == "head" and not head_ok and not t.first_user:
                place = "tail"  # no user turn to head (a completions prompt): the end is the next best place
            elif place == "head" and (t.first_user or not at_head_ok(c.key, place)):
                continue
            keep.append(c)
            t.places.append(place)
        t.moving = keep
    return dirs


def _value_without_lines(text: str, f: Found, candidates: list[Candidate]) -> int:
    """A section's value hash, its metadata lines left out: a line that changes moves on its own, and must not
    make the whole section look per-request."""
    inner = [c for c in candidates if f.start <= c.start < f.end]
    if not inner:
        return f.value
    pieces, cursor = [], f.start
    for c in inner:
        pieces.append(text[cursor : c.start])
        cursor = c.end
    pieces.append(text[cursor : f.end])
    return hash(tuple(pieces))


def _refers_by_position(texts: list[_Text], tail_refs: tuple[str, ...]) -> bool:
    """Whether a scanned text (answer cached per template by `scan_text`) or the last user turn refers
    to a span by position ("the date above")."""
    if any(t.scan is not None and t.scan.refers for t in texts):
        return True
    return any(refers_by_position(r) for r in tail_refs)


def _apply_moves(
    body: dict[str, Any], texts: list[_Text], surface: Surface, model: ModelConfig, view: PromptView, dirs: list[str],
    reminders: tuple[str, int, tuple[int, ...]] | None, facts: ReminderFacts,
) -> dict[str, Any]:
    out = body
    tail: list[str] = []
    head: list[str] = []
    for t in texts:
        if not t.moving and not t.sections:
            continue
        new_text, pieces = t.removed()
        for piece, place in pieces:
            (head if place == "head" else tail).append(piece)
        out = with_text(out, t.slot.path, new_text)
    if head and view.first_user is not None:
        lead = shared_preamble(
            [(t.slot.part, t.text, t.scan is None or bool(t.scan.candidates)) for t in texts if t.first_user], dirs,
            facts,
        )
        out = at_head(out, view.first_user, "\n\n".join(head_order(head)), view.part_type, lead)
    if reminders is not None:  # after the edits above, which address parts by their index in the body as sent
        out = _without_parts(out, body, reminders, tail)
    return surface.place_tail(out, tail, model.tail_placement) if tail else out


def _without_parts(out: dict[str, Any], body: dict[str, Any], where: tuple[str, int, tuple[int, ...]],
                   tail: list[str]) -> dict[str, Any]:
    """`out` without the given text parts of one turn of `body` (found by identity: a part an earlier edit
    rewrote stays where it is), their texts appended to `tail`."""
    key, index, drop = where
    sent = body[key][index]["content"]
    gone = {id(sent[j]) for j in drop}
    content = out[key][index]["content"]
    kept = [p for p in content if id(p) not in gone]
    if len(kept) == len(content):
        return out
    tail.extend(p["text"] for p in content if id(p) in gone)
    return with_text(out, (key, index, "content"), kept)


def _tool_order(model: ModelConfig) -> ToolOrder:
    """Per-model tool order; ModelConfig has no such field yet, so "name" unless one is added."""
    order = model.__dict__.get("tool_order", "name")
    return "client" if order == "client" else "name"


def _date_to_pin(body: dict[str, Any], surface: Surface, model: ModelConfig, now: datetime) -> str | None:
    """Llama 3 templates print today's date near the top unless given one: pin it to the UTC day."""
    if not surface.template_kwargs or not model.template_inserts_date:
        return None
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and "date_string" in kwargs:
        return None
    day = now.astimezone(UTC) if now.tzinfo is not None else now
    return day.strftime("%d %b %Y")
