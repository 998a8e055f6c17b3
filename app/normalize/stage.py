"""The normalize stage: move learned-volatile metadata lines to the tail, canonicalize tools, pin the date."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.config import ModelConfig
from app.context import NormalizeReport, Operation, Tenant
from app.normalize.memory import TenantMemory, VolatilityMemory
from app.normalize.placement import is_restated, last_user_index, place_in_chat, place_in_prompt
from app.normalize.regions import refers_by_position
from app.normalize.rules import RULES
from app.normalize.scan import Candidate, Scan, remove_spans, scan_text
from app.normalize.tools import ToolOrder, canonicalize_tools

_ALL_RULES = frozenset(RULES)
_LEADING_ROLES = frozenset({"system", "developer"})


class _Text:
    """One scanned text: where it lives in the body, and the lines that will move out of it."""

    __slots__ = ("moving", "msg_index", "part_index", "scan", "text")

    def __init__(self, msg_index: int, part_index: int, text: str) -> None:
        self.msg_index = msg_index  # -1 for a completion prompt
        self.part_index = part_index  # -1 when the content is a plain string
        self.text = text
        self.moving: list[Candidate] = []
        self.scan: Scan | None = None

    def removed(self) -> tuple[str, list[str]]:
        """The text without its moving lines, and those lines verbatim (reusing the scan's when all move)."""
        if self.scan is not None and len(self.moving) == len(self.scan.candidates):
            return self.scan.rest, self.scan.lines
        return remove_spans(self.text, [(c.start, c.end) for c in self.moving])


def normalize(
    body: dict[str, Any],
    *,
    operation: Operation,
    tenant: Tenant,
    model: ModelConfig,
    memory: VolatilityMemory,
    opt_out: bool,
    now: datetime,
) -> tuple[dict[str, Any], NormalizeReport]:
    """Rewrite a request for a stable prefix (mode "on"), or only report what would change ("observe").

    Pure except for `memory`, which learns span volatility in place (observe mode learns too, so
    switching a tenant on starts warm). "off", the per-request opt-out and embeddings return `body`
    itself untouched and teach nothing. Observe never modifies `body`; "on" returns a new dict that
    shares every sub-object it did not change.
    """
    mode = tenant.normalize
    if mode == "off" or opt_out or operation == "embeddings":
        return body, NormalizeReport(mode="off")
    allowed = _ALL_RULES if tenant.normalize_rules is None else _ALL_RULES & tenant.normalize_rules

    if operation == "chat":
        texts, refs = _chat_texts(body)
    else:
        texts, refs = _prompt_texts(body)
    moved: dict[str, int] = {}
    if allowed and texts:
        tenant_memory = memory.for_tenant(tenant.id)
        _learn(texts, allowed, tenant_memory, now)
        moving = [c for t in texts for c in t.moving]
        blocked = bool(moving) and (
            not _can_restate(body, operation, model) or _refers_by_position(texts, refs)
        )
        if blocked:
            for t in texts:
                t.moving = []
        else:
            for c in moving:
                for rule in c.rules:
                    moved[rule] = moved.get(rule, 0) + 1

    tools = body.get("tools") if operation == "chat" else None
    new_tools, tools_changed = (tools, 0)
    if isinstance(tools, list) and tools:
        new_tools, tools_changed = canonicalize_tools(tools, _tool_order(model))

    date_string = _date_to_pin(body, operation, model, now)

    if mode == "observe":
        return body, NormalizeReport(
            mode="observe", moved=moved, tools_canonicalized=tools_changed, date_pinned=date_string is not None
        )
    if not moved and not tools_changed and date_string is None:
        return body, NormalizeReport(mode="on")

    out = dict(body)
    if moved:
        _apply_moves(out, texts, operation, model)
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


def _chat_texts(body: dict[str, Any]) -> tuple[list[_Text], list[str]]:
    """The leading system/developer messages and the first user message, split into text parts."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return [], []
    texts: list[_Text] = []
    first_user: int | None = None
    leading = True
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            leading = False
            continue
        role = msg.get("role")
        if leading and role in _LEADING_ROLES:
            if not is_restated(msg.get("content")):
                texts.extend(_parts(i, msg.get("content")))
            continue
        leading = False
        if role == "user":
            first_user = i
            texts.extend(_parts(i, msg.get("content")))
            break
    refs = [t.text for t in texts]
    last_user = last_user_index(messages)
    if last_user is not None and last_user != first_user:
        refs.extend(t.text for t in _parts(last_user, messages[last_user].get("content")))
    return texts, refs


def _parts(msg_index: int, content: Any) -> list[_Text]:
    if isinstance(content, str):
        return [_Text(msg_index, -1, content)]
    if isinstance(content, list):
        return [
            _Text(msg_index, j, part["text"])
            for j, part in enumerate(content)
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        ]
    return []


def _prompt_texts(body: dict[str, Any]) -> tuple[list[_Text], list[str]]:
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        return [], []  # token ids or batches of prompts: left alone
    return [_Text(-1, -1, prompt)], [prompt]


def _learn(texts: list[_Text], allowed: frozenset[str], memory: TenantMemory, now: datetime) -> None:
    """Find candidates in every scanned text, teach the memory, keep the ones known to be volatile.

    Lines that share a key inside one text (same skeleton, same neighbours) are one unit: observed
    once with the hash of all their values, moved together or not at all. Observing them one by one
    would let a request contradict itself and make the outcome depend on line order.
    """
    for t in texts:
        slot = (t.msg_index, t.part_index)
        t.scan = scan_text(t.text, slot, allowed, now, memory)
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


def _refers_by_position(texts: list[_Text], refs: list[str]) -> bool:
    """Whether a scanned text (answer cached per template by `scan_text`) or the last user turn refers
    to a span by position ("the date above")."""
    if any(t.scan is not None and t.scan.refers for t in texts):
        return True
    return any(refers_by_position(r) for r in refs[len(texts) :])


def _can_restate(body: dict[str, Any], operation: Operation, model: ModelConfig) -> bool:
    if operation != "chat" or model.tail_placement == "system":
        return True
    messages = body.get("messages")
    return isinstance(messages, list) and last_user_index(messages) is not None


def _apply_moves(out: dict[str, Any], texts: list[_Text], operation: Operation, model: ModelConfig) -> None:
    restated: list[str] = []
    if operation != "chat":
        t = texts[0]
        new_prompt, lines = t.removed()
        out["prompt"] = place_in_prompt(new_prompt, lines)
        return
    messages: list[Any] = list(out["messages"])
    for t in texts:
        if not t.moving:
            continue
        new_text, lines = t.removed()
        restated.extend(lines)
        msg = messages[t.msg_index]
        if t.part_index < 0:
            messages[t.msg_index] = {**msg, "content": new_text}
        else:
            parts = list(msg["content"])
            parts[t.part_index] = {**parts[t.part_index], "text": new_text}
            messages[t.msg_index] = {**msg, "content": parts}
    out["messages"] = place_in_chat(messages, restated, model.tail_placement)


def _tool_order(model: ModelConfig) -> ToolOrder:
    """Per-model tool order; ModelConfig has no such field yet, so "name" unless one is added."""
    order = model.__dict__.get("tool_order", "name")
    return "client" if order == "client" else "name"


def _date_to_pin(body: dict[str, Any], operation: Operation, model: ModelConfig, now: datetime) -> str | None:
    """Llama 3 templates print today's date near the top unless given one: pin it to the UTC day."""
    if operation != "chat" or not model.template_inserts_date:
        return None
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and "date_string" in kwargs:
        return None
    day = now.astimezone(UTC) if now.tzinfo is not None else now
    return day.strftime("%d %b %Y")
