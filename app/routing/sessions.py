"""Session affinity: a session stays on the replica that holds its history; new sessions balance the load.

A coding agent's session grows one prompt for an hour (tens of thousands of tokens); its cache is worth far more
than its system prompt's, which every replica caches after one request. The prefix key cannot tell sessions apart
(every session of a client shares its system text), and bounded load judged per request moved single turns of a
session between replicas (issue 21: one session went up1, up0, up0, up1, up0). So, per pool:

- a session's first request is placed: only replicas whose active sessions stay within
  ceil(balance x (sessions + 1) / n) (or below `warm_floor`, where its prefix is live) may take it; among those,
  the ones where a live session starting with the same prefix already is (its system prompt and tools are cached
  there: a Claude Code prompt is 24k tokens of them), and among those the pool's own policy picks (prefix
  affinity: the prefix's rendezvous home, so sessions of one client share a replica while it has room; kv_events:
  the replica holding most of its prefix). Without the warm preference a burst of new sessions spread every
  client over every replica: on 12 sessions of 3 clients over 4 replicas, 12 cold system prompts where 6 do; the
  floor lets a grouped burst pair up too (8 where the bound alone paid 12; docs/measurements/agents-lab.md);
- its next requests go to the same replica, whatever the per-request load, unless that replica left rotation or
  is really overloaded (in-flight past move_bound x the mean and move_min); then the pool's policy picks among the
  others — the replica with most of its prefix — and the session lives there from then on.

The table is per pool and per gateway process (other processes place the sessions they see themselves), kept
across rebuilds of the cluster state, bounded by `max_sessions` and forgotten after `idle_s` unseen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from app.config.sessions import SessionSettings
from app.routing.policy import Policy, Selection
from app.routing.prefix_affinity import bound
from app.routing.session_key import SessionKey
from app.routing.session_table import SessionTable

if TYPE_CHECKING:
    from app.records import PromptBlocks
    from app.routing.state import ReplicaState


def _load(r: ReplicaState) -> int:
    return r.shared_load if r.shared_load >= 0 else r.in_flight + r.external


def overloaded(replica: ReplicaState, candidates: Sequence[ReplicaState], settings: SessionSettings) -> bool:
    """Whether one more request would take `replica` past move_bound x the mean in-flight load (and move_min)."""
    load = _load(replica) + 1
    if load <= settings.move_min:
        return False
    return load > bound(settings.move_bound, sum(_load(r) for r in candidates) + 1, len(candidates))


def route_session(policy: Policy, table: SessionTable, candidates: Sequence[ReplicaState], key: int,
                  blocks: PromptBlocks | None, session: SessionKey) -> Selection:
    """The session's replica (`session_home`), a new session's placement (`session_new`) or, when its replica is
    gone or overloaded, the pool policy's pick among the others (`session_moved`)."""
    settings = table.settings
    if len(candidates) == 1:
        sel = policy.select(candidates, key, blocks)  # nowhere else to go: the policy's own reason
        table.place(session.key, sel.chosen.url, key)
        return sel
    url = table.home(session.key)
    if url is not None:
        current = next((r for r in candidates if r.url == url), None)
        if current is not None and not overloaded(current, candidates, settings):
            table.place(session.key, url, key)
            # The policy on that one replica: kv_events predicts its cached tokens (and notes the request for
            # its staleness check); prefix affinity answers at once.
            at_home = policy.select((current,), key, blocks)
            return Selection(current, None, "session_home", at_home.cached_tokens)
        others = [r for r in candidates if r is not current]
        sel = policy.select(others, key, blocks)
        table.place(session.key, sel.chosen.url, key)
        return Selection(sel.chosen, current, "session_moved", sel.cached_tokens)
    limit = bound(settings.balance, sum(table.count(r.url) for r in candidates) + 1, len(candidates))
    allowed = [r for r in candidates if table.count(r.url) + 1 <= limit]
    # The replica with the fewest sessions always passes the bound; `allowed` is empty only when sessions live on
    # replicas outside `candidates` (left rotation), and then any candidate may take it.
    allowed = allowed or list(candidates)
    # A warm replica may go past the bound up to warm_floor (a cold one never): the bound alone spread a grouped
    # burst of one client's 4 sessions over 4 replicas, 4 cold 24k-token system prompts where 2 do.
    warm_limit = max(limit, settings.warm_floor)
    warm = [r for r in candidates if table.warm(key, r.url) and table.count(r.url) + 1 <= warm_limit]
    sel = policy.select(warm or allowed, key, blocks)
    table.place(session.key, sel.chosen.url, key)
    return Selection(sel.chosen, sel.runner_up, "session_new", sel.cached_tokens)
