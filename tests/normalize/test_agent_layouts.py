"""Normalization on agent sessions shaped as the real clients send them: never worse than direct, per request kind,
and a new session in another directory (or after a git-status change) reuses the shared system prompt and tools.

Hand-made bodies (tests/normalize/agent_bodies.py) through `normalize`, then the sim's rendering and a chained
block cache (tests/normalize/prefix_model.py), arm by arm on a fresh cache and a fresh memory.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from app.normalize import VolatilityMemory, normalize
from app.sim.prefix_replay import PrefixCache, render
from app.surfaces import CHAT, MESSAGES, RESPONSES, Surface
from tests.normalize.agent_bodies import SESSIONS, Request, Workspace
from tests.normalize.helpers import NOW, model, tenant

SURFACE: dict[str, Surface] = {"messages": MESSAGES, "chat": CHAT, "responses": RESPONSES}
HOME = Workspace()
ELSEWHERE = Workspace(cwd="/home/dev/other-project", commits="9e8d7c6 other history")
CHANGED = Workspace(status="?? notes.txt")


def scenario(client: str) -> list[tuple[str, Request]]:
    """Six turns in one repo, a new session there, one in another directory, one after a git-status change."""
    make = SESSIONS[client]
    out = [("session", r) for r in make("a1b2c3d4-0001", HOME, 6)]
    out += [("same_repo", r) for r in make("a1b2c3d4-0002", HOME, 1)]
    out += [("other_dir", r) for r in make("a1b2c3d4-0003", ELSEWHERE, 1)]
    out += [("git_change", r) for r in make("a1b2c3d4-0004", CHANGED, 1)]
    return out


def replay(client: str, mode: str) -> dict[str, list[tuple[int, int]]]:
    """(cached, prompt) characters of every request, by kind: `first` of each session phase, `turn`, `tool`."""
    surface = SURFACE[client]
    cache = PrefixCache()
    memory = VolatilityMemory()
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for phase, (kind, headers, body) in scenario(client):
        sent = body
        if mode == "on":
            sent, _ = normalize(body, surface=surface, tenant=tenant("on"), model=model(), memory=memory,
                                opt_out=False, now=NOW, headers=headers)
        hit = cache.serve(render(client, sent))
        out[kind if phase == "session" else f"{phase}_{kind}"].append(hit)
        out["all"].append(hit)
    return out


def ratio(hits: list[tuple[int, int]]) -> float:
    return sum(c for c, _ in hits) / sum(p for _, p in hits)


@pytest.mark.parametrize("client", ["messages", "chat", "responses"])
def test_normalization_is_never_worse_than_direct_per_request_kind(client: str) -> None:
    direct, on = replay(client, "off"), replay(client, "on")
    assert direct.keys() == on.keys()
    for kind in direct:
        assert ratio(on[kind]) >= ratio(direct[kind]), kind


@pytest.mark.parametrize("client", ["messages", "chat"])
def test_a_session_elsewhere_reuses_the_shared_system_prompt_and_tools(client: str) -> None:
    direct, on = replay(client, "off"), replay(client, "on")
    assert ratio(direct["other_dir_first"]) < 0.7  # what the clients lose today (the sections sit before the tools)
    for kind in ("other_dir_first", "git_change_first"):
        assert ratio(on[kind]) >= 0.95, kind


def test_codex_turns_stay_append_only() -> None:
    direct, on = replay("responses", "off"), replay("responses", "on")
    assert ratio(on["all"]) == ratio(direct["all"])  # nothing of Codex's needs moving: it is already in place


def test_each_turn_of_a_session_repeats_the_layout_of_its_first() -> None:
    memory = VolatilityMemory()
    firsts: list[Any] = []
    for _, headers, body in SESSIONS["messages"]("a1b2c3d4-0009", HOME, 3):
        sent, report = normalize(body, surface=MESSAGES, tenant=tenant("on"), model=model(), memory=memory,
                                 opt_out=False, now=NOW, headers=headers)
        assert report.to_head == 3  # the memory path, the environment, the git status
        firsts.append((sent["system"], sent["messages"][0]))
    assert all(f == firsts[0] for f in firsts)
