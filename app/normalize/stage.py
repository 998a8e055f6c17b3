"""The normalize stage: move learned-volatile metadata lines to the tail, canonicalize tools, pin the date."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from app.config import ModelConfig
from app.context import NormalizeReport, Tenant
from app.normalize.memory import TenantMemory, VolatilityMemory
from app.normalize.regions import refers_by_position
from app.normalize.rules import RULES
from app.normalize.scan import Candidate, Scan, remove_spans, scan_text
from app.normalize.tools import ToolOrder, canonicalize_tools
from app.prompt import PromptView, TextSlot, with_text

if TYPE_CHECKING:
    from app.surfaces.base import Surface

_ALL_RULES = frozenset(RULES)


class _Text:
    """One scanned text of the prompt head, and the lines that will move out of it."""

    __slots__ = ("moving", "scan", "slot")

    def __init__(self, slot: TextSlot) -> None:
        self.slot = slot
        self.moving: list[Candidate] = []
        self.scan: Scan | None = None

    @property
    def text(self) -> str:
        """The slot's text as the client sent it."""
        return self.slot.text

    def removed(self) -> tuple[str, list[str]]:
        """The text without its moving lines, and those lines verbatim (reusing the scan's when all move)."""
        if self.scan is not None and len(self.moving) == len(self.scan.candidates):
            return self.scan.rest, self.scan.lines
        return remove_spans(self.text, [(c.start, c.end) for c in self.moving])


def normalize(
    body: dict[str, Any],
    *,
    surface: Surface,
    view: PromptView | None = None,
    tenant: Tenant,
    model: ModelConfig,
    memory: VolatilityMemory,
    opt_out: bool,
    now: datetime,
) -> tuple[dict[str, Any], NormalizeReport]:
    """Rewrite a request for a stable prefix (mode "on"), or only report what would change ("observe").

    Pure except for `memory`, which learns span volatility in place (observe mode learns too, so
    switching a tenant on starts warm). "off", the per-request opt-out and surfaces that are never
    normalized (embeddings) return `body` itself untouched and teach nothing. Observe never modifies
    `body`; "on" returns a new dict that shares every sub-object it did not change. `view` is the
    surface's view of `body` (built here when not given).
    """
    mode = tenant.normalize
    if mode == "off" or opt_out or not surface.normalizable:
        return body, NormalizeReport(mode="off")
    allowed = _ALL_RULES if tenant.normalize_rules is None else _ALL_RULES & tenant.normalize_rules
    if view is None:
        view = surface.view(body)
    texts = [_Text(slot) for slot in view.head]
    moved: dict[str, int] = {}
    if allowed and texts:
        tenant_memory = memory.for_tenant(tenant.id)
        _learn(texts, allowed, tenant_memory, now)
        moving = [c for t in texts for c in t.moving]
        blocked = bool(moving) and (
            not (model.tail_placement == "system" or view.restatable) or _refers_by_position(texts, view.tail_refs)
        )
        if blocked:
            for t in texts:
                t.moving = []
        else:
            for c in moving:
                for rule in c.rules:
                    moved[rule] = moved.get(rule, 0) + 1

    tools = body.get("tools") if surface.has_tools else None
    new_tools, tools_changed = (tools, 0)
    if isinstance(tools, list) and tools:
        new_tools, tools_changed = canonicalize_tools(tools, _tool_order(model))

    date_string = _date_to_pin(body, surface, model, now)

    if mode == "observe":
        return body, NormalizeReport(
            mode="observe", moved=moved, tools_canonicalized=tools_changed, date_pinned=date_string is not None
        )
    if not moved and not tools_changed and date_string is None:
        return body, NormalizeReport(mode="on")

    out = _apply_moves(body, texts, surface, model) if moved else dict(body)
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
    )


def _learn(texts: list[_Text], allowed: frozenset[str], memory: TenantMemory, now: datetime) -> None:
    """Find candidates in every scanned text, teach the memory, keep the ones known to be volatile.

    Lines that share a key inside one text (same skeleton, same neighbours) are one unit: observed
    once with the hash of all their values, moved together or not at all. Observing them one by one
    would let a request contradict itself and make the outcome depend on line order.
    """
    for t in texts:
        t.scan = scan_text(t.text, (t.slot.turn, t.slot.part), allowed, now, memory)
        groups: dict[int, list[Candidate]] = {}
        for c in t.scan.candidates:
            groups.setdefault(c.key, []).append(c)
        for key, group in groups.items():
            value = group[0].value if len(group) == 1 else hash(tuple(c.value for c in group))
            presume = memory.peek(key) is None and any(c.presume_volatile() for c in group)
            if memory.observe(key, value, presume):
                t.moving.extend(group)
        if len(groups) < len(t.scan.candidates):
            t.moving.sort(key=lambda c: c.start)


def _refers_by_position(texts: list[_Text], tail_refs: tuple[str, ...]) -> bool:
    """Whether a scanned text (answer cached per template by `scan_text`) or the last user turn refers
    to a span by position ("the date above")."""
    if any(t.scan is not None and t.scan.refers for t in texts):
        return True
    return any(refers_by_position(r) for r in tail_refs)


def _apply_moves(body: dict[str, Any], texts: list[_Text], surface: Surface, model: ModelConfig) -> dict[str, Any]:
    out = body
    restated: list[str] = []
    for t in texts:
        if not t.moving:
            continue
        new_text, lines = t.removed()
        restated.extend(lines)
        out = with_text(out, t.slot.path, new_text)
    return surface.place_tail(out, restated, model.tail_placement)


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
