"""How spans vary (per request, per session) and the session that names them; the session's pinned layout."""

from __future__ import annotations

import json

from app.normalize import VolatilityMemory
from app.normalize.session import session_key
from app.normalize.varying import ACROSS, RELAX_AFTER_SESSIONS, WITHIN, Variation
from app.surfaces import CHAT, MESSAGES
from tests.normalize.helpers import NOW, STATIC_SYSTEM, model, tenant


def test_a_change_within_a_session_is_per_request_and_one_between_sessions_per_session() -> None:
    v = Variation(16)
    assert v.observe(1, 10, session=100) == 0
    assert v.observe(1, 10, session=100) == 0
    assert v.observe(1, 11, session=101) == ACROSS  # another session, another value
    assert v.observe(1, 11, session=101) == ACROSS
    assert v.observe(1, 12, session=101) == ACROSS | WITHIN  # changed inside one session


def test_a_section_needs_two_changes_in_a_row_within_a_session() -> None:
    v = Variation(16)
    v.observe(2, 1, session=7, within_after=2)
    assert v.observe(2, 2, session=7, within_after=2) == 0  # an edit
    assert v.observe(2, 3, session=7, within_after=2) == WITHIN


def test_a_variation_between_sessions_settles_after_many_sessions_with_one_value() -> None:
    v = Variation(16)
    v.observe(3, 1, session=0)
    assert v.observe(3, 2, session=1) == ACROSS
    for s in range(2, 2 + RELAX_AFTER_SESSIONS):
        flags = v.observe(3, 2, session=s)
    assert flags == 0


def test_the_session_comes_from_headers_then_body_fields_then_the_first_user_turn() -> None:
    body = {"messages": [{"role": "user", "content": "fix it"}], "max_tokens": 8}
    view = MESSAGES.view(body)
    by_history = session_key(None, body, view)
    assert by_history == session_key({}, {**body, "messages": [*body["messages"], {"role": "assistant",
                                                                                  "content": "ok"}]},
                                     view)
    assert session_key({"x-claude-code-session-id": "s1"}, body, view) != by_history
    meta = {"user_id": json.dumps({"device_id": "d", "session_id": "s1"})}
    assert session_key(None, {**body, "metadata": meta}, view) == session_key(None, {**body, "metadata": meta}, view)
    assert session_key(None, {**body, "metadata": meta}, view) != by_history
    assert session_key(None, {**body, "prompt_cache_key": "k"}, view) != by_history


def _chat(system: str, user: str, *later: dict[str, str]) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user},
                                       *later]}


def test_a_section_learned_mid_session_stays_in_place_for_that_session_only() -> None:
    from app.normalize import normalize

    memory = VolatilityMemory()

    def run(body: dict[str, object], sid: str) -> tuple[dict[str, object], int]:
        out, report = normalize(body, surface=CHAT, tenant=tenant("on"), model=model(), memory=memory,
                                opt_out=False, now=NOW, headers={"x-session-id": sid})
        return out, report.to_head

    def system(plan: str) -> str:  # an unnamed section, learned only once it changes between sessions
        return STATIC_SYSTEM + f"\n# Plan\n{plan}\n"

    a1, moved = run(_chat(system("step one"), "go"), "A")
    assert moved == 0 and a1["messages"][0]["content"] == system("step one")  # never seen to change: in place
    _, moved = run(_chat(system("other plan"), "go"), "B")  # changed between sessions: per session from now on
    assert moved == 1
    a2, moved = run(_chat(system("step one"), "go", {"role": "assistant", "content": "done"},
                          {"role": "user", "content": "next"}), "A")
    assert moved == 0 and a2["messages"][0]["content"] == system("step one")  # A keeps the layout it started with
    c, moved = run(_chat(system("third"), "go"), "C")
    assert moved == 1 and c["messages"][1]["content"].startswith("# Plan\nthird")
