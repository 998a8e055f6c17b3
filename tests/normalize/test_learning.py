"""Learning past the typed rules: `key=value` / `key: value` lines whose value keeps changing move to the tail."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.normalize import BLOCK_CLOSE, BLOCK_OPEN, VolatilityMemory, normalize
from app.normalize.lines import parse_learned
from app.normalize.memory import RELAX_AFTER_SAMES, LearnedKey
from app.normalize.rules import RULES, TYPED_RULES
from app.normalize.scan import find_candidates
from app.surfaces import MESSAGES, RESPONSES
from tests.normalize.helpers import NOW, STATIC_SYSTEM, chat_body, model, run, tenant

ALL = frozenset(RULES)
NONCES = ["4f8a2", "91c0e", "a7d13", "0b5f4", "e2c98", "37aa1"]


def billing(i: int, version: str = "2.1.3") -> str:
    """Claude Code's billing line: a static version and entry point, a per-request nonce."""
    return f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli; cch={NONCES[i % len(NONCES)]};"


def moved_lines(out: dict[str, Any]) -> list[str]:
    """The lines restated in the trailing block of a chat body (none if there is no block)."""
    last = out["messages"][-1]["content"]
    if not (isinstance(last, str) and last.startswith(BLOCK_OPEN)):
        return []
    return last[len(BLOCK_OPEN) + 1 : -len(BLOCK_CLOSE) - 1].split("\n")


def series(make: Any, n: int, memory: VolatilityMemory | None = None) -> list[tuple[dict[str, Any], Any]]:
    """Run `n` requests built by `make(i)` through one tenant's memory."""
    memory = memory or VolatilityMemory()
    return [run(make(i), memory=memory) for i in range(n)]


@pytest.mark.parametrize(
    ("line", "values"),
    [
        ("cch=4f8a2", ("4f8a2",)),
        ("nonce=Zk81", ("Zk81",)),
        ("Ticket: 5dd349", ("5dd349",)),
        ("Ticket number: 5dd349", ("5dd349",)),
        ("- **Nonce:** Zk81", ("Zk81",)),
        ("x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=4f8a2;", ("2.1.3", "cli", "4f8a2")),
        ("cc_version=2.1.3, cch=4f8a2", ("2.1.3", "4f8a2")),
        ("build_no=77 node=w-3 nonce=Zk81==", ("77", "w-3", "Zk81==")),
    ],
)
def test_key_value_lines_parse_with_every_value_blanked(line: str, values: tuple[str, ...]) -> None:
    got = parse_learned(line, 0, len(line), ALL)
    assert got is not None and got.values == values and got.rules == ("learned",)
    assert got.skeleton.count("\x01") == len(values) and not any(v in got.skeleton for v in values if len(v) > 3)


@pytest.mark.parametrize(
    "line",
    [
        "Status: ok",  # a word, not a machine value
        "Note: see the docs for 2 examples",  # prose
        "Call me at 10:30",  # no label, a time in prose
        "see https://example.com/a?b=1",  # a URL in prose
        "see https://example.com/a1",
        "commit=3f2a9c1",  # content identifier
        "Version: 5dd349",
        'nonce="Zk81"',  # quoted: a payload
        "payload={a: 1}",
        "1. nonce=Zk81 and more words",
        "",
    ],
)
def test_prose_payloads_and_content_ids_are_not_learnable(line: str) -> None:
    assert parse_learned(line, 0, len(line), ALL) is None


def test_learning_respects_the_tenants_typed_rules() -> None:
    line = "Current time: 2026-11-30T01:02:03Z"
    assert parse_learned(line, 0, len(line), frozenset({"uuid", "learned"})) is None  # iso_datetime not allowed
    assert rules_of(line + "\nstatic", frozenset({"learned"})) == []
    assert rules_of("Ticket: 5dd349\nstatic", TYPED_RULES) == []  # `learned` not allowed: nothing learned


def rules_of(text: str, allowed: frozenset[str] = ALL) -> list[tuple[str, ...]]:
    return [c.rules for c in find_candidates(text, ("s",), allowed, NOW)]


def test_typed_lines_stay_typed_and_learned_keys_are_marked() -> None:
    found = find_candidates("Request ID: req_8f3kd93jd0\nnonce=Zk81\nYou are terse.", ("s",), ALL, NOW)
    assert [c.rules for c in found] == [("prefixed_id",), ("learned",)]
    assert type(found[0].key) is int and type(found[1].key) is LearnedKey


def test_a_lone_single_pair_is_not_learnable_but_a_lone_multi_pair_line_is() -> None:
    assert rules_of("Ticket: 5dd349") == []  # could be a user's whole message
    assert rules_of("Ticket: 5dd349\n\nSummarize the ticket.") == [("learned",)]
    assert rules_of(billing(0)) == [("learned",)]  # Claude Code sends it as a text block of its own


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda i: chat_body(billing(i) + "\n" + STATIC_SYSTEM), id="cch"),
        pytest.param(lambda i: chat_body(f"Ticket: {NONCES[i]}d\n\n" + STATIC_SYSTEM), id="ticket"),
        pytest.param(lambda i: chat_body(f"nonce={NONCES[i][:2].upper()}{i}1\n" + STATIC_SYSTEM), id="nonce"),
    ],
)
def test_a_changing_value_is_learned_within_three_requests(make: Any) -> None:
    results = series(make, 5)
    assert [r.moved_total for _, r in results] == [0, 0, 1, 1, 1]
    for i, (out, report) in enumerate(results[2:], start=2):
        assert report.moved == {"learned": 1}
        assert out["messages"][0]["content"] == STATIC_SYSTEM.lstrip("\n")
        assert moved_lines(out) == [make(i)["messages"][0]["content"].split("\n")[0]]  # verbatim, whole line


def test_static_key_value_lines_never_move() -> None:
    system = "cc_version=2.1.3; cc_entrypoint=cli\nTicket: 5dd349\n\n" + STATIC_SYSTEM
    for out, report in series(lambda i: chat_body(system), 30):
        assert out["messages"][0]["content"] == system and report.moved_total == 0


def test_a_value_that_changes_once_does_not_become_volatile() -> None:
    def make(i: int) -> dict[str, Any]:
        version = "2.1.3" if i < 4 else "2.1.4"  # one bump, then the new version stays
        return chat_body(f"cc_version={version}; cc_entrypoint=cli\n\n" + STATIC_SYSTEM)

    assert all(report.moved_total == 0 for _, report in series(make, 10))


def test_a_version_bump_does_not_reset_what_was_learned_about_the_nonce() -> None:
    memory = VolatilityMemory()
    series(lambda i: chat_body(billing(i) + "\n" + STATIC_SYSTEM), 3, memory)
    out, report = run(chat_body(billing(3, version="2.1.4") + "\n" + STATIC_SYSTEM), memory=memory)
    assert report.moved == {"learned": 1} and moved_lines(out) == [billing(3, version="2.1.4")]


def test_a_learned_line_settles_back_in_place_once_its_value_stops_changing() -> None:
    memory = VolatilityMemory()

    def make(i: int) -> dict[str, Any]:
        return chat_body(f"nonce={NONCES[min(i, 3)]}\n" + STATIC_SYSTEM)  # changes 3 times, then stays

    results = series(make, 4 + RELAX_AFTER_SAMES + 2, memory)
    moved = [r.moved_total for _, r in results]
    assert moved[2:4] == [1, 1]
    assert moved[4 : 3 + RELAX_AFTER_SAMES] == [1] * (RELAX_AFTER_SAMES - 1)
    assert moved[3 + RELAX_AFTER_SAMES :] == [0, 0, 0]


def test_a_session_constant_value_is_learned_when_sessions_interleave() -> None:
    sessions = ["s81a", "s92b", "s03c"]
    results = series(lambda i: chat_body(f"conversation_key={sessions[i % 3]}\n" + STATIC_SYSTEM), 6)
    assert [r.moved_total for _, r in results] == [0, 0, 1, 1, 1, 1]


def test_learned_lines_in_protected_regions_never_move() -> None:
    def make(i: int) -> dict[str, Any]:
        n = NONCES[i]
        system = (
            f"```ini\nnonce={n}\n```\n> cch={n}\n<document>\nTicket: {n}\n</document>\n"
            f'{{\n  "x": 1,\n  cch={n}\n}}\n<example>\nnonce={n}; cch={n}\n</example>\n' + STATIC_SYSTEM
        )
        return chat_body(system)

    for i, (out, report) in enumerate(series(make, 6)):
        assert report.moved_total == 0 and out["messages"][0]["content"] == make(i)["messages"][0]["content"]


def test_values_in_free_prose_are_not_learned() -> None:
    results = series(lambda i: chat_body(f"Your ticket is {NONCES[i]}d, use it in replies.\n" + STATIC_SYSTEM), 5)
    assert all(r.moved_total == 0 for _, r in results)


def test_a_user_message_that_is_only_a_pair_stays_put() -> None:
    results = series(lambda i: chat_body(STATIC_SYSTEM, user=f"x = {i}7"), 5)
    assert all(r.moved_total == 0 for _, r in results)


def test_learned_moves_are_idempotent_and_restate_each_line_once() -> None:
    memory = VolatilityMemory()
    make = lambda i: chat_body(billing(i) + "\nTicket: " + NONCES[i] + "d\n\n" + STATIC_SYSTEM)  # noqa: E731
    series(make, 3, memory)
    body = make(3)
    once, report = run(body, memory=memory)
    assert report.moved == {"learned": 2}
    assert moved_lines(once) == [billing(3), "Ticket: " + NONCES[3] + "d"]
    twice, again = run(once, memory=memory)
    assert twice == once and again.moved_total == 0


def test_claude_code_shaped_messages_request_moves_a_billing_line_that_heads_a_block() -> None:
    # vLLM drops a system block that starts with the billing line, whatever follows it; moving the line
    # keeps the rest. (A block that is only the billing line is dropped by vLLM and left alone here.)
    def make(i: int) -> dict[str, Any]:
        return {
            "model": "m",
            "max_tokens": 64,
            "system": [
                {"type": "text", "text": billing(i) + "\nYou are an interactive CLI tool."},
                {
                    "type": "text",
                    "text": "You are Claude Code.\n" + STATIC_SYSTEM,
                    "cache_control": {"type": "ephemeral"},
                },
            ],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "fix the bug"}]}],
        }

    memory = VolatilityMemory()
    reports = []
    for i in range(4):
        body = make(i)
        snapshot = copy.deepcopy(body)
        out, report = normalize(
            body, surface=MESSAGES, tenant=tenant(), model=model(), memory=memory, opt_out=False, now=NOW
        )
        assert body == snapshot
        reports.append(report.moved_total)
    assert reports == [0, 0, 1, 1]
    assert out["system"][0]["text"] == "You are an interactive CLI tool." and out["system"][1] == make(3)["system"][1]
    tail = out["messages"][-1]["content"][-1]["text"]
    assert tail == BLOCK_OPEN + "\n" + billing(3) + "\n" + BLOCK_CLOSE


def test_a_system_block_that_is_only_the_billing_line_is_left_for_vllm_to_drop() -> None:
    memory = VolatilityMemory()
    for i in range(4):
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "fix the bug"}],
                "system": [{"type": "text", "text": billing(i)}, {"type": "text", "text": STATIC_SYSTEM}]}
        out, report = normalize(
            body, surface=MESSAGES, tenant=tenant(), model=model(), memory=memory, opt_out=False, now=NOW
        )
        assert report.moved_total == 0 and out["system"][0]["text"] == billing(i)


def test_memory_per_tenant_stays_bounded_under_many_learned_templates() -> None:
    memory = VolatilityMemory(capacity_per_tenant=32)
    for i in range(500):
        run(chat_body(f"shard_{i}=x{i}; cch={NONCES[i % 6]}\n" + STATIC_SYSTEM), memory=memory)
    assert memory.size("acme") == 32


def test_learned_memory_holds_numbers_only() -> None:
    memory = VolatilityMemory()
    for i in range(4):
        run(chat_body(billing(i) + "\nTicket: " + NONCES[i] + "d\n\n" + STATIC_SYSTEM * 3), memory=memory)
    tm = memory.for_tenant("acme")
    entries = list(tm._spans.items())
    assert entries and all(isinstance(k, int) and all(type(x) is int for x in v) for k, v in entries)
    assert all(-RELAX_AFTER_SAMES <= v[2] <= 2 for k, v in entries if type(k) is LearnedKey)


def test_codex_shaped_responses_request_moves_a_learned_line_out_of_the_instructions() -> None:
    def make(i: int) -> dict[str, Any]:
        return {
            "model": "m",
            "instructions": f"turn_nonce={NONCES[i]}\n" + STATIC_SYSTEM,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "list the files"}]}],
        }

    memory = VolatilityMemory()
    moved = []
    for i in range(4):
        out, report = normalize(
            make(i), surface=RESPONSES, tenant=tenant(), model=model(), memory=memory, opt_out=False, now=NOW
        )
        moved.append(report.moved_total)
    assert moved == [0, 0, 1, 1]
    assert out["instructions"] == STATIC_SYSTEM
    assert out["input"][0]["content"][-1] == {
        "type": "input_text",
        "text": BLOCK_OPEN + f"\nturn_nonce={NONCES[3]}\n" + BLOCK_CLOSE,
    }


def test_observe_mode_learns_learned_lines_without_touching_the_body() -> None:
    memory = VolatilityMemory()
    for i in range(3):
        body = chat_body(billing(i) + "\n" + STATIC_SYSTEM)
        out, report = run(body, memory=memory, mode="observe")
        assert out is body
    assert report.moved == {"learned": 1} and not report.applied
    _, on = run(chat_body(billing(3) + "\n" + STATIC_SYSTEM), memory=memory)  # switched on: starts warm
    assert on.moved == {"learned": 1}
