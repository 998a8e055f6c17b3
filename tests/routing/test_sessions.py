"""Session affinity (app/routing/sessions.py, app/routing/session_key.py): a session stays on its replica, new
sessions balance the load, a session moves only when its replica is gone or really overloaded."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from app.config.sessions import SessionSettings
from app.context import ClassDecision, RouteDecision
from app.routing.pick import pick
from app.routing.session_key import SessionKey, session_key
from app.routing.session_table import SessionTable
from app.routing.state import ClusterState
from app.surfaces import CHAT, MESSAGES, RESPONSES
from tests.routing.factory import make_cluster, make_config

INTERACTIVE = ClassDecision("interactive", "stream")
FAST = [f"http://127.0.0.1:91{i:02d}" for i in range(4)]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agents"


def cluster(**routing: Any) -> tuple[ClusterState, Any]:
    cfg = make_config(FAST, [], routing=routing, fast_extra={"policy": "prefix_affinity"})
    return make_cluster(cfg), cfg


def route(state: ClusterState, cfg: Any, session: int | None, key: int = 7) -> RouteDecision:
    s = SessionKey(session, "header") if session is not None else None
    return pick(model=cfg.models[0], decision=INTERACTIVE, key=key, cluster=state, cfg=cfg.routing, session=s)


def test_a_session_stays_on_its_replica_while_its_load_is_ordinary() -> None:
    state, cfg = cluster()
    first = route(state, cfg, 1)
    assert first.reason == "session_new" and first.session == "header"
    home = state.pools["fast"].replicas[[r.url for r in state.pools["fast"].replicas].index(first.replica)]
    home.in_flight = 5  # busier than the others, but below move_min: a session does not hop for that
    again = [route(state, cfg, 1) for _ in range(5)]
    assert {r.replica for r in again} == {first.replica} and {r.reason for r in again} == {"session_home"}


def test_new_sessions_of_one_prefix_are_spread_evenly_over_the_replicas() -> None:
    state, cfg = cluster()
    placed = Counter(route(state, cfg, s, key=42).replica for s in range(12))
    assert sorted(placed.values()) == [3, 3, 3, 3]


def test_mixed_new_sessions_share_the_replicas_that_hold_their_prefix_and_stay_balanced() -> None:
    for clients in ([11, 22, 33], [101, 202, 303], [7, 8, 9], [1000, 2000, 3000], [5, 50, 500]):
        state, cfg = cluster()
        # Three clients (prefix keys), four sessions each, arriving interleaved as mixed traffic does.
        placed = [(key, route(state, cfg, s, key=key).replica) for s, key in enumerate(clients * 4)]
        assert sorted(Counter(url for _, url in placed).values()) == [3, 3, 3, 3]
        # Each prefix on two replicas: six cold system prompts; a count-only balance paid up to twelve.
        assert len(set(placed)) == 6, clients


def test_a_grouped_burst_pairs_each_clients_first_sessions_and_still_ends_balanced() -> None:
    for clients in ([11, 22, 33], [101, 202, 303], [7, 8, 9], [1000, 2000, 3000], [5, 50, 500]):
        state, cfg = cluster()
        # Four sessions of one client, then four of the next: the order a team's morning start gives.
        placed = [(key, route(state, cfg, s, key=key).replica) for s, key in enumerate(k for k in clients
                                                                                      for _ in range(4))]
        assert sorted(Counter(url for _, url in placed).values()) == [3, 3, 3, 3]
        # The first two clients on two replicas each, the last on the four slots left: eight cold system
        # prompts; the balance bound alone paid one per session and replica (up to twelve).
        assert len(set(placed)) == 8, clients


def test_warm_floor_1_spreads_a_burst_by_the_balance_bound_alone() -> None:
    state, cfg = cluster(sessions={"warm_floor": 1})
    placed = [route(state, cfg, s, key=42).replica for s in range(4)]
    assert sorted(Counter(placed).values()) == [1, 1, 1, 1]


def test_without_a_session_the_prefix_home_decides_as_before() -> None:
    state, cfg = cluster()
    picks = {route(state, cfg, None, key=42).replica for _ in range(6)}
    assert len(picks) == 1 and route(state, cfg, None, key=42).session is None


def test_a_session_moves_when_its_replica_leaves_rotation_and_then_stays_on_the_new_one() -> None:
    state, cfg = cluster()
    first = route(state, cfg, 9)
    gone = next(r for r in state.pools["fast"].replicas if r.url == first.replica)
    gone.healthy = gone.in_rotation = False
    moved = route(state, cfg, 9)
    assert moved.reason == "session_moved" and moved.replica != first.replica
    gone.healthy = gone.in_rotation = True
    assert route(state, cfg, 9).replica == moved.replica, "it lives where it moved to (its history is there now)"


def test_a_session_moves_only_when_its_replica_is_really_overloaded() -> None:
    state, cfg = cluster()
    first = route(state, cfg, 3)
    home = next(r for r in state.pools["fast"].replicas if r.url == first.replica)
    home.in_flight = 30  # 30 of 31 in flight: far past 2 x the mean and move_min
    moved = route(state, cfg, 3)
    assert moved.reason == "session_moved" and moved.replica != first.replica


def test_round_robin_pools_ignore_sessions() -> None:
    cfg = make_config(FAST, [], fast_extra={"policy": "round_robin"})
    state = make_cluster(cfg)
    assert state.pools["fast"].sessions is None
    picks = [route(state, cfg, 1).replica for _ in range(4)]
    assert len(set(picks)) == 4


def test_sessions_off_routes_requests_as_before() -> None:
    state, cfg = cluster(sessions={"enabled": False})
    assert state.pools["fast"].sessions is None and route(state, cfg, 1).reason == "prefix_home"


def test_a_rebuild_of_the_cluster_keeps_where_sessions_live() -> None:
    state, cfg = cluster()
    first = route(state, cfg, 5)
    rebuilt = ClusterState.from_config(cfg, state)
    assert route(rebuilt, cfg, 5).replica == first.replica


def test_an_idle_session_is_forgotten_and_placed_again() -> None:
    now = [0.0]
    state, cfg = cluster(sessions={"idle_s": 10})
    table = state.pools["fast"].sessions
    assert table is not None
    table._clock = lambda: now[0]
    route(state, cfg, 1)
    now[0] = 11.0
    assert table.home(SessionKey(1, "header").key) is None and len(table) == 0


def test_a_replica_is_warm_for_a_prefix_only_while_a_live_session_with_it_is_there() -> None:
    now = [0.0]
    table = SessionTable(SessionSettings(idle_s=10), clock=lambda: now[0])
    table.place(1, "a", prefix=42)
    table.place(2, "a", prefix=42)
    table.place(2, "b", prefix=42)  # session 2 moved: "a" still holds session 1
    assert table.warm(42, "a") and table.warm(42, "b") and not table.warm(7, "a")
    now[0] = 11.0
    table.home(1)  # both idle past idle_s: forgotten
    assert not table.warm(42, "a") and not table.warm(42, "b") and table.count("a") == 0


# -- where the session key comes from ---------------------------------------------------------------------------


def captured(client: str) -> list[dict[str, Any]]:
    path = FIXTURES / f"{client}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def headers_of(rec: dict[str, Any]) -> dict[str, str]:
    return {k.lower(): v for k, v in rec["headers"].items()}


def keys_by_session(client: str, surface: Any) -> dict[str, set[tuple[int, str]]]:
    out: dict[str, set[tuple[int, str]]] = {}
    for rec in captured(client):
        if rec.get("api") and isinstance(rec.get("body"), dict) and rec["kind"] != "other":
            sk = session_key(headers_of(rec), rec["body"], surface.view(rec["body"]), "salt")
            assert sk is not None
            out.setdefault(rec["session"], set()).add((sk.key, sk.source))
    return out


def test_each_captured_session_of_each_client_has_one_key_of_its_own() -> None:
    for client, surface, source in (("claude", MESSAGES, "header"), ("codex", RESPONSES, "prompt_cache_key"),
                                    ("opencode", CHAT, "header"), ("qwen", CHAT, "history")):
        found = keys_by_session(client, surface)
        if not found:
            continue
        assert all(len(keys) == 1 for keys in found.values()), (client, found)
        assert len({next(iter(k)) for k in found.values()}) == len(found), f"{client}: sessions share a key"
        assert {src for keys in found.values() for _, src in keys} == {source}


def test_a_reminder_the_client_drops_from_its_first_turn_does_not_change_the_history_key() -> None:
    # Qwen Code names no session: its date reminder sits in the first user turn until a second turn follows.
    first = [{"type": "text", "text": "<system-reminder>\nThe current date is: Thursday.\n</system-reminder>"},
             {"type": "text", "text": "Turn 1: fix the parser"}]
    one = {"messages": [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": first}]}
    two = {"messages": [one["messages"][0], {"role": "user", "content": first[1:]},
                        {"role": "assistant", "content": "done"}, {"role": "user", "content": "Turn 2"}]}
    a, b = session_key({}, one, CHAT.view(one), "s"), session_key({}, two, CHAT.view(two), "s")
    assert a is not None and a == b and a.source == "history"


def test_claude_codes_metadata_session_is_the_same_session_as_its_header() -> None:
    meta = {"metadata": {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": "abc"})}}
    by_header = session_key({"x-claude-code-session-id": "abc"}, {}, MESSAGES.view({"messages": []}), "s")
    by_meta = session_key({}, meta, MESSAGES.view({"messages": []}), "s")
    old_style = session_key({}, {"metadata": {"user_id": "user_1f_account__session_abc"}},
                            MESSAGES.view({"messages": []}), "s")
    assert by_header is not None and by_meta is not None and old_style is not None
    assert by_header.key == by_meta.key == old_style.key and by_meta.source == "metadata"


def test_without_a_named_session_the_history_names_it_and_tenants_never_share_one() -> None:
    def body(first: str, turns: int) -> dict[str, Any]:
        msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": first}]
        for i in range(turns):
            msgs += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": f"go on {i}"}]
        return {"messages": msgs}

    def key(b: dict[str, Any], salt: str = "t1") -> SessionKey | None:
        return session_key({}, b, CHAT.view(b), salt)

    a1, a5, b1 = key(body("fix the parser", 0)), key(body("fix the parser", 4)), key(body("add a test", 0))
    assert a1 is not None and a5 is not None and b1 is not None
    assert a1 == a5 and a1.source == "history" and a1.key != b1.key
    assert key(body("fix the parser", 0), "t2") != a1
    assert session_key({}, body("x", 0), CHAT.view(body("x", 0)), "t1", history=False) is None
