"""Workload shape and determinism."""

from __future__ import annotations

import re

import orjson
import pytest

from app.bench.workloads import WORKLOADS, Workload, WorkloadOptions, agent_system_prompt, tool_definitions

MODEL = "m"


def _turns(workload: Workload, index: int, replies: int = 10) -> list[dict]:
    session = workload.session(index)
    bodies = []
    while not session.done and len(bodies) < replies:
        bodies.append(session.next_request(MODEL, stream=True).body)
        session.record_reply(f"reply {len(bodies)}")
    return bodies


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_gives_identical_requests(name: str) -> None:
    a = [_turns(Workload(name, WorkloadOptions(seed=7)), i) for i in range(5)]
    b = [_turns(Workload(name, WorkloadOptions(seed=7)), i) for i in range(5)]
    assert orjson.dumps(a) == orjson.dumps(b)


@pytest.mark.parametrize("name", WORKLOADS)
def test_other_seed_gives_other_requests(name: str) -> None:
    a = [_turns(Workload(name, WorkloadOptions(seed=1)), i) for i in range(5)]
    b = [_turns(Workload(name, WorkloadOptions(seed=2)), i) for i in range(5)]
    assert orjson.dumps(a) != orjson.dumps(b)


def test_session_content_does_not_depend_on_the_order_sessions_are_made() -> None:
    w = Workload("agent", WorkloadOptions(seed=3))
    forward = [_turns(w, i) for i in range(4)]
    backward = [_turns(w, i) for i in reversed(range(4))][::-1]
    assert orjson.dumps(forward) == orjson.dumps(backward)


def test_agent_system_prompt_is_about_1500_tokens_by_chars_over_4() -> None:
    body = Workload("agent", WorkloadOptions()).session(0).next_request(MODEL, True).body
    system = body["messages"][0]
    assert system["role"] == "system"
    assert 1300 <= len(system["content"]) / 4 <= 1700


def test_agent_system_prompt_starts_with_timestamp_and_ids_that_change_per_request() -> None:
    w = Workload("agent", WorkloadOptions())
    session = w.session(0)
    first = session.next_request(MODEL, True).body["messages"][0]["content"]
    session.record_reply("ok")
    second = session.next_request(MODEL, True).body["messages"][0]["content"]
    header = re.compile(r"^Current time: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\nRequest ID: req_[0-9a-f]{16}\n")
    assert header.match(first) and header.match(second)
    assert first.splitlines()[:2] != second.splitlines()[:2]
    static = agent_system_prompt(0)
    assert first.endswith(static) and second.endswith(static)


def test_agent_tools_key_order_shuffles_between_requests_but_content_is_equal() -> None:
    w = Workload("agent", WorkloadOptions())
    tool_lists = [b["tools"] for i in range(3) for b in _turns(w, i)]
    assert all(len(tools) == 8 for tools in tool_lists)
    assert all(tools == tool_definitions() for tools in tool_lists)  # dict equality ignores key order
    assert len({orjson.dumps(tools) for tools in tool_lists}) > 1


def test_agent_static_has_no_volatile_header_and_byte_identical_tools() -> None:
    w = Workload("agent-static", WorkloadOptions())
    bodies = [b for i in range(3) for b in _turns(w, i)]
    assert {b["messages"][0]["content"] for b in bodies} == {agent_system_prompt(0)}
    assert len({orjson.dumps(b["tools"]) for b in bodies}) == 1


def test_agent_sessions_are_multi_turn_and_carry_previous_replies() -> None:
    session = Workload("agent", WorkloadOptions()).session(1)
    assert len(session.user_turns) >= 3
    first = session.next_request(MODEL, True).body
    session.record_reply("the first answer")
    second = session.next_request(MODEL, True).body
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][1] == first["messages"][1]
    assert second["messages"][2]["content"] == "the first answer"
    assert second["messages"][3]["content"] != first["messages"][1]["content"]


def test_streaming_requests_ask_for_usage() -> None:
    body = Workload("chat", WorkloadOptions()).session(0).next_request(MODEL, stream=True).body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    plain = Workload("chat", WorkloadOptions()).session(0).next_request(MODEL, stream=False).body
    assert plain["stream"] is False and "stream_options" not in plain


def test_bulk_requests_are_flex_with_long_outputs() -> None:
    body = Workload("bulk", WorkloadOptions()).session(0).next_request(MODEL, True).body
    chat = Workload("chat", WorkloadOptions()).session(0).next_request(MODEL, True).body
    assert body["service_tier"] == "flex"
    assert body["max_tokens"] > 4 * chat["max_tokens"]


def test_max_tokens_option_overrides_workload_default() -> None:
    body = Workload("bulk", WorkloadOptions(max_tokens=33)).session(0).next_request(MODEL, True).body
    assert body["max_tokens"] == 33


def test_mixed_sends_class_header_at_the_given_ratio() -> None:
    w = Workload("mixed", WorkloadOptions(mixed_ratio=0.75, class_header="x-class"))
    requests = [w.session(i).next_request(MODEL, True) for i in range(400)]
    assert all(r.headers["x-class"] == r.route_class for r in requests)
    assert all(("service_tier" in r.body) == (r.route_class == "bulk") for r in requests)
    share = sum(r.route_class == "interactive" for r in requests) / len(requests)
    assert 0.65 < share < 0.85


def test_sessions_spread_over_tenant_keys() -> None:
    w = Workload("chat", WorkloadOptions(api_keys=("k1", "k2", "k3")))
    keys = [w.session(i).next_request(MODEL, True).api_key for i in range(6)]
    assert keys == ["k1", "k2", "k3", "k1", "k2", "k3"]
    generated = Workload("chat", WorkloadOptions(tenants=2))
    assert {generated.session(i).api_key for i in range(4)} == {"sk-bench-tenant-0", "sk-bench-tenant-1"}
    single = Workload("chat", WorkloadOptions(api_key="sk-one"))
    assert single.session(5).api_key == "sk-one"


def test_agent_tool_choice_defaults_to_none_and_can_be_auto_or_left_out() -> None:
    def body(**kw: str) -> dict:
        return Workload("agent", WorkloadOptions(**kw)).session(0).next_request(MODEL, True).body

    assert body()["tool_choice"] == "none"
    assert body(tool_choice="auto")["tool_choice"] == "auto"
    assert "tool_choice" not in body(tool_choice="omit")


def test_unknown_workload_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        Workload("nope", WorkloadOptions())


def test_synthetic_prompts_have_the_requested_token_count_by_the_estimate() -> None:
    from app.bench.workloads import _token_counter

    count = _token_counter(None)
    w = Workload("synthetic", WorkloadOptions(prompt_tokens=200))
    prompts = [w.session(i).user_turns[0] for i in range(10)]
    assert all(abs(count(p) - 200) <= 2 for p in prompts)  # whole words: within a word of the target
    assert len(set(prompts)) == 10  # fresh per session: nothing for a prefix cache to share


def test_synthetic_prompts_are_exact_with_a_real_tokenizer(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    w = Workload("synthetic", WorkloadOptions(prompt_tokens=77, tokenizer=str(tmp_path)))
    session = w.session(3)
    assert len(tok.encode(session.user_turns[0]).ids) == 77
    assert session.system is None or session.system == ""
    assert len(session.user_turns) == 1
