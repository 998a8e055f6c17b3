"""The normalize entry point: modes, learning, placement, date pinning, what it must never touch."""

from __future__ import annotations

import copy
from datetime import timedelta

from app.normalize import BLOCK_CLOSE, BLOCK_OPEN, VolatilityMemory
from tests.normalize.helpers import NOW, STATIC_SYSTEM, chat_body, header, run


def test_off_returns_the_same_object_and_learns_nothing() -> None:
    memory = VolatilityMemory()
    body = chat_body(header(0) + STATIC_SYSTEM)
    out, report = run(body, memory=memory, mode="off")
    assert out is body
    assert report.mode == "off" and report.header() == "off"
    assert memory.size() == 0


def test_opt_out_header_acts_like_off() -> None:
    memory = VolatilityMemory()
    body = chat_body(header(0) + STATIC_SYSTEM)
    snapshot = copy.deepcopy(body)
    out, report = run(body, memory=memory, opt_out=True)
    assert out is body and body == snapshot
    assert report.mode == "off"


def test_embeddings_are_left_alone() -> None:
    body = {"model": "m", "input": header(0)}
    out, report = run(body, memory=VolatilityMemory(), operation="embeddings")
    assert out is body and report.moved_total == 0


def test_observe_reports_but_leaves_the_body_untouched() -> None:
    memory = VolatilityMemory()
    tools = [
        {"type": "function", "function": {"name": "b", "parameters": {}}},
        {"type": "function", "function": {"name": "a"}},
    ]
    body = chat_body(header(0) + STATIC_SYSTEM, tools=tools)
    snapshot = copy.deepcopy(body)
    out, report = run(body, memory=memory, mode="observe")
    assert out is body and body == snapshot
    assert report.mode == "observe" and not report.applied
    assert report.moved == {"iso_datetime": 1, "prefixed_id": 1, "uuid": 1}
    assert report.tools_canonicalized == 2
    assert report.header().startswith("observe;moved=3;")


def test_on_moves_per_request_lines_to_a_trailing_system_message_and_a_session_id_to_the_first_user_turn() -> None:
    memory = VolatilityMemory()
    body = chat_body(header(0) + STATIC_SYSTEM)
    body["messages"].append({"role": "assistant", "content": "Which one?"})
    body["messages"].append({"role": "user", "content": "1234"})
    snapshot = copy.deepcopy(body)
    out, report = run(body, memory=memory)
    assert body == snapshot  # input not mutated
    assert report.applied and report.moved_total == 3 and report.to_head == 1
    assert out["messages"][0]["content"] == STATIC_SYSTEM
    current, request, session = header(0).rstrip("\n").split("\n")
    assert out["messages"][1]["content"] == session + "\n\nWhere is my order?"  # per session: it never moves again
    tail = out["messages"][-1]
    assert tail["role"] == "system"
    assert tail["content"] == BLOCK_OPEN + "\n" + current + "\n" + request + "\n" + BLOCK_CLOSE
    assert out["messages"][2] is body["messages"][2]  # untouched messages are shared, not copied


def test_user_placement_appends_a_block_to_the_last_user_message() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": header(0) + STATIC_SYSTEM},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": [{"type": "text", "text": "and now?"}]},
        ],
    }
    out, _ = run(body, memory=VolatilityMemory(), placement="user")
    assert len(out["messages"]) == 4
    assert out["messages"][1]["content"] == header(0).rstrip("\n").split("\n")[2] + "\n\nhi"
    last = out["messages"][3]["content"]
    assert last[0] == {"type": "text", "text": "and now?"}
    assert last[1]["text"].startswith(BLOCK_OPEN + "\nCurrent time: ")


def test_user_placement_without_a_user_message_moves_nothing() -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": header(0) + STATIC_SYSTEM}]}
    out, report = run(body, memory=VolatilityMemory(), placement="user")
    assert out is body and report.moved_total == 0


def test_static_labelled_date_stays_until_seen_changing() -> None:
    memory = VolatilityMemory()
    system = "Date: 2026-11-30\n" + STATIC_SYSTEM
    _, r1 = run(chat_body(system), memory=memory)
    _, r2 = run(chat_body(system), memory=memory)
    assert r1.moved_total == r2.moved_total == 0
    out3, r3 = run(chat_body("Date: 2026-12-01\n" + STATIC_SYSTEM), memory=memory)
    assert r3.moved == {"date": 1}
    assert out3["messages"][0]["content"] == STATIC_SYSTEM


def test_few_shot_dates_stay_put_across_requests() -> None:
    memory = VolatilityMemory()
    for i in range(4):
        out, _ = run(chat_body(header(i) + STATIC_SYSTEM), memory=memory)
        assert out["messages"][0]["content"] == STATIC_SYSTEM  # "Date: 2024-01-05" example kept in place


def test_unlabelled_whole_line_value_moves_once_seen_changing() -> None:
    memory = VolatilityMemory()
    _, r1 = run(chat_body("2026-11-30T01:00:00Z\n" + STATIC_SYSTEM), memory=memory)
    _, r2 = run(chat_body("2026-11-30T01:05:00Z\n" + STATIC_SYSTEM), memory=memory)
    assert r1.moved_total == 0 and r2.moved == {"iso_datetime": 1}


def test_positional_reference_blocks_moving() -> None:
    memory = VolatilityMemory()
    body = chat_body(header(0) + STATIC_SYSTEM, user="How many days after the date above is Friday?")
    out, report = run(body, memory=memory)
    assert out is body and report.moved_total == 0
    system = header(1) + "Use the timestamp above for every answer.\n" + STATIC_SYSTEM
    out, report = run(chat_body(system), memory=memory)
    assert out["messages"][0]["content"] == system and report.moved_total == 0


def test_assistant_and_tool_messages_are_never_scanned() -> None:
    memory = VolatilityMemory()
    messages = [
        {"role": "system", "content": STATIC_SYSTEM},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": header(0)},
        {"role": "tool", "tool_call_id": "c1", "content": header(1)},
        {"role": "user", "content": header(2)},
    ]
    out, report = run({"model": "m", "messages": messages}, memory=memory)
    assert out["messages"] == messages and report.moved_total == 0


def test_first_user_message_per_request_lines_move_and_later_user_messages_do_not() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": header(0) + "Where is my order?"},
            {"role": "assistant", "content": "Which one?"},
            {"role": "user", "content": header(1) + "Order 1234."},
        ],
    }
    out, report = run(body, memory=VolatilityMemory())
    assert report.moved_total == 2  # the session line is where a per-session line belongs already
    assert out["messages"][0]["content"] == header(0).split("\n")[2] + "\n\nWhere is my order?"
    assert out["messages"][2] is body["messages"][2]


def test_text_completion_prompt_keeps_its_final_cue_last() -> None:
    prompt = header(0) + "You are terse.\n\nUser: hi\nAssistant:"
    out, report = run({"model": "m", "prompt": prompt}, memory=VolatilityMemory(), operation="text_completion")
    assert report.moved_total == 3
    assert out["prompt"].startswith("You are terse.\n\nUser: hi\n" + BLOCK_OPEN)
    assert out["prompt"].endswith(BLOCK_CLOSE + "\nAssistant:")


def test_date_is_pinned_at_day_granularity_for_templates_that_insert_it() -> None:
    body = chat_body(STATIC_SYSTEM, chat_template_kwargs={"enable_thinking": False})
    out, report = run(body, memory=VolatilityMemory(), inserts_date=True, now=NOW + timedelta(hours=5))
    assert report.date_pinned and report.applied
    assert out["chat_template_kwargs"] == {"enable_thinking": False, "date_string": "30 Nov 2026"}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_client_date_string_is_respected() -> None:
    body = chat_body(STATIC_SYSTEM, chat_template_kwargs={"date_string": "01 Jan 2025"})
    out, report = run(body, memory=VolatilityMemory(), inserts_date=True)
    assert out is body and not report.date_pinned


def test_rules_subset_limits_what_moves() -> None:
    memory = VolatilityMemory()
    out, report = run(chat_body(header(0) + STATIC_SYSTEM), memory=memory, rules=frozenset({"uuid"}))
    assert report.moved == {"uuid": 1}
    assert out["messages"][0]["content"].startswith("Current time: ")


def test_report_header_never_carries_values() -> None:
    body = chat_body(header(0) + STATIC_SYSTEM)
    _, report = run(body, memory=VolatilityMemory())
    value = report.header()
    assert "req_" not in value and "2026" not in value and value.startswith("on;moved=3;rules=")


def test_a_change_outside_the_known_lines_is_still_learned() -> None:
    memory = VolatilityMemory()
    padding = STATIC_SYSTEM * 3  # long enough for the cached fast path
    for i in range(3):
        run(chat_body(header(i) + padding), memory=memory)
    out, report = run(chat_body(header(3) + padding + "Deadline: 2026-12-04\n"), memory=memory)
    assert report.moved_total == 3  # the new line is seen once: not yet known to change
    out, report = run(chat_body(header(4) + padding + "Deadline: 2026-12-05\n"), memory=memory)
    assert report.moved == {"iso_datetime": 1, "prefixed_id": 1, "uuid": 1, "date": 1}
    assert out["messages"][0]["content"] == padding


def test_alternating_templates_both_keep_their_static_prefix() -> None:
    memory = VolatilityMemory()
    prompts = [STATIC_SYSTEM * 3, "You are terse.\n" * 60]
    for i in range(6):
        static = prompts[i % 2]
        out, report = run(chat_body(header(i) + static), memory=memory)
        assert out["messages"][0]["content"] == static and report.moved_total == 3


def test_per_user_id_is_learned_not_presumed() -> None:
    memory = VolatilityMemory()
    system = "User ID: user_00301\n\n" + STATIC_SYSTEM
    _, first = run(chat_body(system), memory=memory)
    _, again = run(chat_body(system), memory=memory)  # same session: same user
    out, other = run(chat_body("User ID: user_00417\n\n" + STATIC_SYSTEM), memory=memory)
    assert first.moved_total == again.moved_total == 0
    assert other.moved == {"prefixed_id": 1}
    assert out["messages"][0]["content"] == STATIC_SYSTEM


def test_assistant_prefill_stays_the_last_message() -> None:
    body = chat_body(header(0) + STATIC_SYSTEM)
    body["messages"].append({"role": "assistant", "content": "Sure, order"})
    out, report = run(body, memory=VolatilityMemory())
    assert report.moved_total == 3
    assert [m["role"] for m in out["messages"]] == ["system", "user", "system", "assistant"]
    assert out["messages"][-1] is body["messages"][-1]


def test_crlf_line_endings_move_whole_lines() -> None:
    system = header(0).replace("\n", "\r\n") + STATIC_SYSTEM.replace("\n", "\r\n")
    out, report = run(chat_body(system), memory=VolatilityMemory())
    assert report.moved_total == 3
    assert out["messages"][0]["content"] == STATIC_SYSTEM.replace("\n", "\r\n")
