"""The gateway pre-warms a discovered replica on sims: the prefixes it becomes home for are cached there before
its first request, whichever surface they came in on (chat, Responses, Messages: each replayed on its own, through
the official SDKs); without pre-warm they are not. A session whose key moved finds its whole history there too
(chat, Messages), unless histories are off. While a replica warms, traffic goes on to the others."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anthropic
import httpx
import openai
import pytest

from app.api.app import create_app
from app.sim.options import SimOptions
from app.sim.server import create_sim_app
from tests.prewarm.test_warmer import Engine
from tests.routing.test_discovery import Records, _port_free_on_both, _wait, discovering_config, serve
from tests.servers import free_port

# Real processes and seconds-long waits: the slow tier (scripts/test.sh runs it after the fast one).
pytestmark = pytest.mark.slow

PREFIXES = 12


def system_prompt(i: int) -> str:
    """A distinct system prompt of a few hundred tokens (its own routing key)."""
    return f"Agent {i}. " + " ".join(f"Rule {i}.{k}: keep record {k * 13 + i} consistent." for k in range(40))


def ask(client: openai.OpenAI, i: int, question: str) -> Any:
    return client.chat.completions.create(
        model="m", max_tokens=2,
        messages=[{"role": "system", "content": system_prompt(i)}, {"role": "user", "content": question}],
    )


def cached_via_chat(base: str, i: int, question: str) -> int:
    """Cached prompt tokens of one chat request (the OpenAI SDK)."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="EMPTY", max_retries=0, timeout=30)
    return ask(client, i, question).usage.prompt_tokens_details.cached_tokens


def cached_via_responses(base: str, i: int, question: str) -> int:
    """Cached input tokens of one Responses request (the OpenAI SDK)."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="EMPTY", max_retries=0, timeout=30)
    reply = client.responses.create(model="m", instructions=system_prompt(i), input=question, max_output_tokens=2,
                                    store=False)
    return reply.usage.input_tokens_details.cached_tokens


def cached_via_messages(base: str, i: int, question: str) -> int:
    """Cache-read input tokens of one Messages request (the Anthropic SDK)."""
    client = anthropic.Anthropic(base_url=base, api_key="EMPTY", max_retries=0, timeout=30)
    reply = client.messages.create(model="m", max_tokens=2, system=system_prompt(i),
                                   messages=[{"role": "user", "content": question}])
    return reply.usage.cache_read_input_tokens or 0


SURFACES: dict[str, Callable[[str, int, str], int]] = {
    "chat": cached_via_chat, "responses": cached_via_responses, "messages": cached_via_messages,
}


def sim() -> Any:
    return create_sim_app(SimOptions(model="served-model", time_scale=50, max_model_len=8192))


@contextmanager
def joining_gateway(prewarm: dict[str, Any]) -> Iterator[tuple[str, Any, Callable[[], None]]]:
    """A gateway discovering one sim (prewarm settings updated by `prewarm`); yields its URL, its Gateway, and
    `join`, which makes discovery list a second sim and returns once both replicas are in rotation."""
    port = _port_free_on_both()
    records = Records("127.0.0.1")
    cfg = discovering_config(f"replicas.test:{port}")
    # Request-level prefix routing: a key's home moves to the joining replica. (With routing.sessions on, a
    # running session stays where its history is and only new sessions go there: nothing here would move.)
    cfg = cfg.model_copy(update={"routing": cfg.routing.model_copy(update={
        "prewarm": cfg.routing.prewarm.model_copy(update=prewarm),
        "sessions": cfg.routing.sessions.model_copy(update={"enabled": False})})})
    app = create_app(cfg)
    gw = app.api.state.gateway
    gw.discoverer.pools["main"].source.resolver = records

    def join() -> None:
        records.addresses = ["127.0.0.1", "127.0.0.2"]
        _wait(lambda: len(gw.cluster.pools["main"].replicas) == 2)
        _wait(lambda: all(r.available() for r in gw.cluster.pools["main"].replicas))

    with (
        serve(sim(), "127.0.0.1", port),
        serve(sim(), "127.0.0.2", port),
        serve(app, "127.0.0.1", free_port()) as base,
    ):
        _wait(lambda: httpx.get(f"{base}/ready").status_code == 200)
        yield base, gw, join


@pytest.mark.parametrize("surface", sorted(SURFACES))
@pytest.mark.parametrize("prewarm", [True, False])
def test_a_discovered_replica_gets_its_share_of_the_prefixes_cached_before_its_first_request(
    prewarm: bool, surface: str
) -> None:
    cached_tokens = SURFACES[surface]
    with joining_gateway({"enabled": prewarm}) as (base, gw, join):
        for i in range(PREFIXES):
            cached_tokens(base, i, "first question")
        join()
        # Each prefix's next request, new question: the ones whose home moved to the new replica land there.
        cached = [cached_tokens(base, i, "a new question") for i in range(PREFIXES)]
    if prewarm:
        run = gw.prewarmer.runs[-1]
        assert run.result == "done" and 0 < run.ok < PREFIXES
        assert min(cached) >= 200, "every prefix hits, on the old replica and the new one"
    else:
        assert gw.prewarmer is None
        assert min(cached) == 0, "the prefixes that moved to the new replica miss there"


def test_while_a_replica_warms_requests_go_on_to_the_others() -> None:
    port = _port_free_on_both()
    slow = Engine(delay_s=60)  # the new replica answers no replay while the test runs
    records = Records("127.0.0.1")
    app = create_app(discovering_config(f"replicas.test:{port}"))
    gw = app.api.state.gateway
    gw.discoverer.pools["main"].source.resolver = records
    with (
        serve(sim(), "127.0.0.1", port),
        serve(slow.app(), "127.0.0.2", port),
        serve(app, "127.0.0.1", free_port()) as base,
    ):
        _wait(lambda: httpx.get(f"{base}/ready").status_code == 200)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="EMPTY", max_retries=0, timeout=30)
        for i in range(PREFIXES):
            ask(client, i, "first question")
        records.addresses = ["127.0.0.1", "127.0.0.2"]
        _wait(lambda: any(r.warming for r in gw.cluster.replicas()))
        new = next(r for r in gw.cluster.replicas() if r.warming)
        for i in range(PREFIXES):
            assert ask(client, i, "meanwhile").choices
        assert new.warming and new.in_flight == 0, "the warming replica took no request; the other served them"
        assert 0 < len(slow.bodies) <= gw.cfg.routing.prewarm.concurrency, "replays, bounded, are all it got"


def tool_output(i: int, turn: int) -> str:
    """A few hundred tokens of a session's own tool output (what makes its history worth warming)."""
    return " ".join(f"line {k}: session {i} turn {turn} value {k * 7 + i}" for k in range(60))


def conversation(i: int, turns: int) -> list[dict[str, str]]:
    """Session `i`'s messages after `turns` turns (user turns carry tool output; replies are fixed)."""
    out: list[dict[str, str]] = []
    for t in range(turns):
        out += [{"role": "user", "content": f"step {t}: {tool_output(i, t)}"}, {"role": "assistant", "content": "ok"}]
    return [*out, {"role": "user", "content": f"step {turns}: {tool_output(i, turns)}"}]


def session_turn_via_chat(base: str, i: int, turns: int) -> tuple[int, int]:
    """(prompt, cached) tokens of session `i`'s request after `turns` turns, through the OpenAI SDK."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="EMPTY", max_retries=0, timeout=30)
    messages = [{"role": "system", "content": system_prompt(i)}, *conversation(i, turns)]
    usage = client.chat.completions.create(model="m", max_tokens=2, messages=messages).usage  # type: ignore[arg-type]
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


def session_turn_via_messages(base: str, i: int, turns: int) -> tuple[int, int]:
    """(prompt, cached) tokens of session `i`'s request after `turns` turns, through the Anthropic SDK."""
    client = anthropic.Anthropic(base_url=base, api_key="EMPTY", max_retries=0, timeout=30)
    usage = client.messages.create(model="m", max_tokens=2, system=system_prompt(i),
                                   messages=conversation(i, turns)).usage  # type: ignore[arg-type]
    cached = usage.cache_read_input_tokens or 0
    return usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0), cached


SESSIONS: dict[str, Callable[[str, int, int], tuple[int, int]]] = {
    "chat": session_turn_via_chat, "messages": session_turn_via_messages,
}


@pytest.mark.parametrize("surface", sorted(SESSIONS))
@pytest.mark.parametrize("history", [True, False])
def test_a_moved_sessions_next_turn_finds_its_history_on_the_new_replica(history: bool, surface: str) -> None:
    turn = SESSIONS[surface]
    with joining_gateway({} if history else {"history_budget_chars": 0}) as (base, gw, join):
        for i in range(PREFIXES):
            for t in range(3):
                turn(base, i, t)
        join()
        ratios = [cached / prompt for prompt, cached in (turn(base, i, 3) for i in range(PREFIXES))]
    run = gw.prewarmer.runs[-1]
    assert run.result == "done" and 0 < run.ok < PREFIXES
    if history:
        assert run.histories == run.ok
        # Only the newest turn (a quarter of the prompt) is new: the rest hits, on the old replica and the new one.
        assert min(ratios) >= 0.7, ratios
    else:
        assert run.histories == 0
        assert min(ratios) < 0.5, "a session that moved finds only its prefix on the new replica"
        assert max(ratios) >= 0.7, "one that stayed finds its history where it was"
