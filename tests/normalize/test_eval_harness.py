"""The normalize evaluation's harness: fixed issue order, counter parsing, and the offline block model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_PATH = Path(__file__).resolve().parents[2] / "experiments" / "normalize_eval.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("normalize_eval", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("normalize_eval", module)
    spec.loader.exec_module(module)
    return module


ev = _load()


def test_issue_order_sends_every_turn_once_in_session_order() -> None:
    turns = [3, 1, 4, 2, 5]
    order = ev.issue_order(turns, 2)
    assert sorted(order) == sorted((s, t) for s, n in enumerate(turns) for t in range(n))
    for s in range(len(turns)):
        assert [t for si, t in order if si == s] == list(range(turns[s]))


def test_issue_order_keeps_at_most_concurrency_sessions_open() -> None:
    turns = [2, 3, 1, 2, 2, 3]
    order = ev.issue_order(turns, 3)
    open_sessions: set[int] = set()
    sent = [0] * len(turns)
    for s, _ in order:
        open_sessions.add(s)
        sent[s] += 1
        assert len(open_sessions) <= 3
        if sent[s] == turns[s]:
            open_sessions.discard(s)


def test_issue_order_is_the_same_for_the_same_turns() -> None:
    assert ev.issue_order([4, 3, 4, 2], 2) == ev.issue_order([4, 3, 4, 2], 2)


def test_counters_sum_label_sets_and_moved_spans_filter_by_tenant() -> None:
    text = (
        '# HELP x\nvllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 256.0\n'
        'gateway_normalize_moved_spans_total{rule="uuid",tenant="eval-on"} 3.0\n'
        'gateway_normalize_moved_spans_total{rule="uuid",tenant="other"} 7.0\n'
    )
    samples = ev.parse_samples(text)
    assert ev.counter_sum(samples, "vllm:prefix_cache_hits_total") == 384.0
    assert ev.moved_by_rule(samples, "eval-on") == {"uuid": 3.0}


def test_sessions_are_identical_across_arms_but_the_ceiling_has_no_volatile_content() -> None:
    target = ev.Target("t", "m", sessions=3, max_turns=4, max_tokens=8, concurrency=1)
    arms = {arm.name: arm for arm in ev.ARMS}
    off, on, ceiling = (ev.make_sessions(arms[name], target, 0) for name in ("off", "on", "ceiling"))
    assert [s.user_turns for s in off] == [s.user_turns for s in on] == [s.user_turns for s in ceiling]
    first_off = off[0].next_request("m", stream=True).body
    first_ceiling = ceiling[0].next_request("m", stream=True).body
    assert first_off["messages"][0]["content"].startswith("Current time:")
    assert first_off["messages"][0]["content"].endswith(first_ceiling["messages"][0]["content"])
    assert first_ceiling["messages"][0]["content"].startswith("You are Atlas")


def test_offline_block_model_caches_the_shared_prefix_only_when_nothing_volatile_leads() -> None:
    off = ev.offline_hits("off", 2, 2, 0, 16, tools=True, tokenizer=None)
    ceiling = ev.offline_hits("ceiling", 2, 2, 0, 16, tools=True, tokenizer=None)
    assert off[0] < off[1] // 20
    assert ceiling[0] > ceiling[1] // 2
