"""`routing.sessions`: keep a coding session on the replica that holds its history (app/routing/sessions.py).

Part of the schema (RoutingConfig mounts it with one line).
"""

from __future__ import annotations

from pydantic import Field

from app.config.types import StrictModel


class SessionSettings(StrictModel):
    """Session affinity for `prefix_affinity` and `kv_events` pools; round robin and least load ignore it."""

    enabled: bool = Field(True, description="Route by session: a session's requests stay on the replica its first "
                          "request was placed on; new sessions are what balances the load.")
    history: bool = Field(True, description="When a request names no session (no prompt_cache_key, session header "
                          "or metadata.user_id), take its system text and first user turn as its identity.")
    balance: float = Field(1.0, ge=1.0, description="A new session goes only to a replica whose active sessions "
                           "stay within ceil(balance x (sessions + 1) / replicas); among those the pool's policy "
                           "picks (its prefix home, or the replica with most of its prefix).")
    warm_floor: int = Field(2, ge=1, description="A new session may join a replica where a live session with "
                            "its prefix is while that replica holds fewer than this many sessions, past the "
                            "balance bound: the first sessions of a burst of one client's pair up instead of "
                            "spreading, one session of imbalance for a cold system prompt saved (24k tokens for "
                            "Claude Code); later sessions keep every replica within the bound. 1: the bound alone.")
    move_bound: float = Field(2.0, ge=1.0, description="A running session leaves its replica only when that "
                              "replica's in-flight requests would pass move_bound x the pool's mean (and "
                              "move_min); it then goes where the pool's policy finds most of its prefix.")
    move_min: int = Field(8, ge=1, description="In-flight requests a session's replica may always hold before "
                          "move_bound applies.")
    idle_s: float = Field(900.0, gt=0, description="A session unseen this long no longer counts for placement and "
                          "loses its replica (its next request is placed as a new session).")
    max_sessions: int = Field(100_000, ge=1, description="Sessions remembered per pool (the least recently seen "
                              "forgotten first); about 100 bytes each.")
