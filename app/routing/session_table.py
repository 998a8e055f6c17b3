"""Where each session of a pool lives: session key -> replica URL, with the active sessions per replica and, per
prefix key, the replicas its live sessions are on.

app/routing/sessions.py decides with it; the pool state (app/routing/state.py) owns one per pool.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from app.config.sessions import SessionSettings

SESSION_POLICIES = frozenset({"prefix_affinity", "kv_events"})


class SessionTable:
    """session key -> (replica URL, prefix key, last seen), least recently seen first; active sessions counted per
    replica and per (prefix key, replica)."""

    def __init__(self, settings: SessionSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._homes: OrderedDict[int, tuple[str, int, float]] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._warm: dict[tuple[int, str], int] = {}

    def __len__(self) -> int:
        return len(self._homes)

    def home(self, key: int) -> str | None:
        """The replica the session lives on (None: new, or forgotten)."""
        self._expire(self._clock())
        found = self._homes.get(key)
        return found[0] if found is not None else None

    def place(self, key: int, url: str, prefix: int = 0) -> None:
        """The session (whose requests start with prefix key `prefix`) lives on `url` from now on, seen now."""
        old = self._homes.pop(key, None)
        if old is not None:
            self._forget(old[0], old[1])
        self._homes[key] = (url, prefix, self._clock())
        self._counts[url] = self._counts.get(url, 0) + 1
        self._warm[(prefix, url)] = self._warm.get((prefix, url), 0) + 1
        while len(self._homes) > self.settings.max_sessions:
            self._drop_oldest()

    def count(self, url: str) -> int:
        """Active sessions on `url`."""
        return self._counts.get(url, 0)

    def warm(self, prefix: int, url: str) -> bool:
        """Whether a live session whose requests start with prefix key `prefix` is on `url` (so its prefix is)."""
        return (prefix, url) in self._warm

    def _expire(self, now: float) -> None:
        horizon = now - self.settings.idle_s
        homes = self._homes
        while homes and next(iter(homes.values()))[2] < horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, (url, prefix, _) = self._homes.popitem(last=False)
        self._forget(url, prefix)

    def _forget(self, url: str, prefix: int) -> None:
        self._counts[url] -= 1
        left = self._warm[(prefix, url)] - 1
        if left:
            self._warm[(prefix, url)] = left
        else:
            del self._warm[(prefix, url)]


def session_table(settings: SessionSettings, policy: str, kept: SessionTable | None) -> SessionTable | None:
    """A pool's table: the one it had (a rebuild keeps where sessions live) unless the settings changed; None
    where sessions are off or the pool's policy (by name) does not care where a prompt's cache is."""
    if not settings.enabled or policy not in SESSION_POLICIES:
        return None
    return kept if kept is not None and kept.settings == settings else SessionTable(settings)
