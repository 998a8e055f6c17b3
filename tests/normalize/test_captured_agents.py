"""Normalization on what the real clients sent (tests/fixtures/agents/, captured by experiments/agents_lab): every
captured session replayed through `normalize`, rendered as the sim renders it and served from a chained block
cache (tests/normalize/prefix_model.py): cached/prompt with normalization is never below the body as sent, per
request kind and session; a session in another directory, or after a git-status change, reuses the system prompt
and the tools the first session cached.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from app.normalize import VolatilityMemory, normalize
from app.sim.prefix_replay import BLOCK_TOKENS, PrefixCache, render
from app.sim.tokenizer import FallbackTokenizer
from app.surfaces import CHAT, MESSAGES, RESPONSES, Surface
from tests.normalize.helpers import NOW, model, tenant

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agents"
SURFACES: dict[str, tuple[str, Surface]] = {
    "/v1/messages": ("messages", MESSAGES),
    "/v1/chat/completions": ("chat", CHAT),
    "/v1/responses": ("responses", RESPONSES),
}
CLIENTS = sorted(p.stem for p in FIXTURES.glob("*.jsonl"))
TOKENIZER = FallbackTokenizer()  # the sim's


def captured(client: str) -> list[dict[str, Any]]:
    """The client's generation requests, in the order it sent them."""
    rows = [json.loads(line) for line in (FIXTURES / f"{client}.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("path") in SURFACES and isinstance(r.get("body"), dict)]


def tail_block(name: str, body: dict[str, Any]) -> str:
    """The rendered last message of a normalized body: the tail block a moved reminder went to."""
    return render(name, {**body, "messages": body["messages"][-1:]})


def replay(client: str, mode: str) -> dict[str, list[tuple[int, int]]]:
    """(cached, prompt) tokens per request, grouped by `<session>/<kind>`, `<kind>` and `all`."""
    return replay_with_tails(client, mode)[0]


def replay_with_tails(client: str, mode: str) -> tuple[dict[str, list[tuple[int, int]]], dict[str, int]]:
    """`replay`, and per group the tokens of the tail blocks that carry a moved reminder (0 elsewhere): a reminder
    at the very end of the input is computed again on every request, which is its price."""
    cache = PrefixCache()
    memory = VolatilityMemory()
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    tails: dict[str, int] = defaultdict(int)
    for row in captured(client):
        name, surface = SURFACES[row["path"]]
        body = row["body"]
        tail = 0
        if mode == "on":
            headers = {k.lower(): v for k, v in (row.get("headers") or {}).items()}
            body, report = normalize(body, surface=surface, tenant=tenant("on"), model=model(), memory=memory,
                                     opt_out=False, now=NOW, headers=headers)
            if report.moved.get("reminder"):
                tail = len(TOKENIZER.encode(tail_block(name, body)))
        hit = cache.serve(render(name, body))
        for group in (f"{row['session']}/{row['kind']}", str(row["kind"]), "all"):
            out[group].append(hit)
            tails[group] += tail
    return out, tails


def ratio(hits: list[tuple[int, int]]) -> float:
    return sum(c for c, _ in hits) / sum(p for _, p in hits)


def uncached(hits: list[tuple[int, int]]) -> int:
    return sum(p - c for c, p in hits)


@pytest.mark.parametrize("client", CLIENTS)
def test_captured_sessions_are_never_worse_than_direct(client: str) -> None:
    direct = replay(client, "off")
    on, tails = replay_with_tails(client, "on")
    assert direct.keys() == on.keys()
    assert ratio(on["all"]) >= ratio(direct["all"])
    for group in direct:
        # Per request kind and per session: no more uncached tokens than as sent, but for the one block per request
        # a moved section can shift the block grid by (sessions), and the tail block of a moved reminder: Qwen Code's
        # date reminder costs ~85 tokens at the end of each request, where it saves the previous turn's tool calls
        # and outputs on each new turn (the overall ratio above).
        slack = (BLOCK_TOKENS * len(direct[group]) if "/" in group else 0) + tails[group]
        assert uncached(on[group]) <= uncached(direct[group]) + slack, (group, uncached(on[group]),
                                                                         uncached(direct[group]))


@pytest.mark.parametrize("client", [c for c in CLIENTS if c in ("claude", "opencode")])
def test_a_captured_session_elsewhere_reuses_the_shared_prefix(client: str) -> None:
    on = replay(client, "on")
    for group in ("other-dir/turn-open", "git-change/turn-open"):
        if group in on:
            assert ratio(on[group]) >= 0.95, (group, ratio(on[group]))


def test_qwen_codes_session_elsewhere_reuses_its_system_prompt_tools_and_shared_reminders() -> None:
    # Qwen Code keeps a git snapshot and its memory paths in the system prompt, its environment in the first user
    # turn between two reminders every session shares: as sent, 31 % of another directory's first request is
    # cached; what is left uncached after normalizing is the memory section past the project path (its text
    # would have to be reworded to share more).
    direct, on = replay("qwen", "off"), replay("qwen", "on")
    assert ratio(direct["other-dir/turn-open"]) < 0.35 and ratio(direct["git-change/turn-open"]) < 0.35
    assert ratio(on["other-dir/turn-open"]) >= 0.92
    assert ratio(on["git-change/turn-open"]) >= 0.98


@pytest.mark.parametrize("client", CLIENTS)
def test_captured_requests_normalize_once(client: str) -> None:
    memory = VolatilityMemory()
    for row in captured(client):
        _, surface = SURFACES[row["path"]]
        headers = {k.lower(): v for k, v in (row.get("headers") or {}).items()}
        kwargs: dict[str, Any] = {"surface": surface, "tenant": tenant("on"), "model": model(), "memory": memory,
                                  "opt_out": False, "now": NOW, "headers": headers}
        once, _ = normalize(row["body"], **kwargs)
        twice, _ = normalize(once, **kwargs)
        assert twice == once, row["seq"]


def _new_chars(previous: str, prompt: str) -> int:
    """Characters of `prompt` past what it shares with `previous` (what a prefix cache computes again)."""
    lo, hi = 0, min(len(previous), len(prompt))
    while lo < hi:  # the longest common prefix, by bisection: C-level slice compares
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if previous[:mid] == prompt[:mid] else (lo, mid - 1)
    return len(prompt) - lo


@pytest.mark.parametrize("client", CLIENTS)
def test_a_captured_sessions_normalized_prompt_recomputes_no_more_than_the_body_as_sent(client: str) -> None:
    # What the live lab showed (docs/measurements/agents-lab.md, 2026-12-02 13:14): within a session nothing the
    # gateway places moves, so each request reuses everything the one before it computed: Claude Code, Codex and
    # opencode send append-only sessions, and so are their normalized prompts. Qwen Code drops the date reminder of
    # the previous user turn itself: what it sends recomputes from there; normalized, the reminder is at the end.
    # opencode's title request is a conversation of its own.
    memory = VolatilityMemory()
    previous: dict[tuple[str, bool], tuple[str, str]] = {}
    for row in captured(client):
        name, surface = SURFACES[row["path"]]
        headers = {k.lower(): v for k, v in (row.get("headers") or {}).items()}
        body, report = normalize(row["body"], surface=surface, tenant=tenant("on"), model=model(), memory=memory,
                                 opt_out=False, now=NOW, headers=headers)
        sent, prompt = render(name, row["body"]), render(name, body)
        # A moved reminder's tail block is new at the end of every request (its price, see above).
        tail = len(tail_block(name, body)) if report.moved.get("reminder") else 0
        thread = (row["session"], row["kind"] == "other")
        if thread in previous:
            sent_before, before = previous[thread]
            assert _new_chars(before, prompt) <= _new_chars(sent_before, sent) + tail, (row["seq"], thread)
            if client != "qwen":
                assert prompt.startswith(before), (row["seq"], thread)
        previous[thread] = (sent, prompt)
