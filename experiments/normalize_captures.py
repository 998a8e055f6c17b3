"""Cached/prompt of captured agent sessions with and without normalization, offline: a table per client.

Replays lab captures (tests/fixtures/agents/*.jsonl, or raw ones from experiments/agents_lab) in order through
`normalize` (a tenant in mode "on", one fresh memory per client) and through nothing ("direct"), renders every body
as `kvgate sim` does and serves it from one chained block cache per arm (tests/normalize/prefix_model.py: the
sim's built-in tokenizer, 16-token blocks; on the lab's Codex captures it reproduces the sim's own numbers, 85.7 %
overall and 92.5 % turn-open). Prints Σcached / Σprompt tokens per request kind and per session, and a ceiling:
what no layout can beat on these bodies — the client's first request cold, every other session's first request
fully cached, and every later request of a session cached up to where it stops sharing with that session's
previous request (the new tool output, reply and user text are new tokens in any order; the more generous of the
direct and normalized bodies).

    PYTHONPATH=. .venv/bin/python experiments/normalize_captures.py [FILE.jsonl ...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.config import ModelConfig
from app.context import Tenant
from app.normalize import VolatilityMemory, normalize
from app.sim.prefix_replay import PrefixCache, render
from app.surfaces import CHAT, MESSAGES, RESPONSES, Surface

NOW = datetime(2026, 11, 30, 1, 0, 0, tzinfo=UTC)  # the captures' day (normalize pins dates against it)
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "agents"
SURFACES: dict[str, tuple[str, Surface]] = {
    "/v1/messages": ("messages", MESSAGES),
    "/v1/chat/completions": ("chat", CHAT),
    "/v1/responses": ("responses", RESPONSES),
}


def model() -> ModelConfig:
    """The public model the captures were sent to (tail placement in the system text)."""
    return ModelConfig(name="m", pools=["fast"], tail_placement="system")


def tenant() -> Tenant:
    """A tenant with normalization on."""
    return Tenant(id="acme", normalize="on")

Hits = dict[str, list[tuple[int, int]]]


def rows_of(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("path") in SURFACES and isinstance(r.get("body"), dict)]


def normalized_row(row: dict[str, Any], surface: Any, memory: VolatilityMemory) -> tuple[Any, Any]:
    """The captured request as kvgate `on` sends it upstream: (body, its normalize report)."""
    headers = {k.lower(): v for k, v in (row.get("headers") or {}).items()}
    return normalize(row["body"], surface=surface, tenant=tenant(), model=model(), memory=memory, opt_out=False,
                     now=NOW, headers=headers)


def replay(rows: list[dict[str, Any]], on: bool) -> tuple[Hits, set[str]]:
    cache, memory = PrefixCache(), VolatilityMemory()
    hits: Hits = defaultdict(list)
    headers_seen: set[str] = set()
    for row in rows:
        name, surface = SURFACES[row["path"]]
        body = row["body"]
        if on:
            body, report = normalized_row(row, surface, memory)
            headers_seen.add(report.header())
        hit = cache.serve(render(name, body))
        for group in ("all", str(row.get("kind")), f"{row.get('session')} / {row.get('kind')}"):
            hits[group].append(hit)
    return hits, headers_seen


def ceiling(rows: list[dict[str, Any]], direct: Hits, normalized: Hits) -> Hits:
    """Per group, the most any layout could cache (module docstring); never below what either arm got."""
    arms = []
    for on in (False, True):
        memory, caches = VolatilityMemory(), defaultdict(PrefixCache)
        served = []
        for row in rows:
            name, surface = SURFACES[row["path"]]
            body = row["body"]
            if on:
                body, _ = normalized_row(row, surface, memory)
            # A side request (opencode's title) is a conversation of its own within the session.
            served.append(caches[(row.get("session"), row.get("kind") == "other")].serve(render(name, body)))
        arms.append(served)
    hits: Hits = defaultdict(list)
    seen: set[Any] = set()
    for i, (row, a, b) in enumerate(zip(rows, *arms, strict=True)):
        prompt = a[1]
        thread = (row.get("session"), row.get("kind") == "other")
        best = max(a[0], b[0], direct["all"][i][0], normalized["all"][i][0])
        if thread not in seen and any(other[1] == thread[1] for other in seen):
            best = prompt  # a later session's first request: all of it could come from other sessions
        seen.add(thread)
        for group in ("all", str(row.get("kind")), f"{row.get('session')} / {row.get('kind')}"):
            hits[group].append((best, prompt))
    return hits


def pct(hits: list[tuple[int, int]]) -> str:
    cached, prompt = sum(c for c, _ in hits), sum(p for _, p in hits)
    return f"{100 * cached / prompt:.1f}% of {prompt:,}"


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or sorted(FIXTURES.glob("*.jsonl"))
    for path in paths:
        rows = rows_of(path)
        direct, _ = replay(rows, on=False)
        normalized, headers = replay(rows, on=True)
        top = ceiling(rows, direct, normalized)
        print(f"\n**{path.name}** ({len(rows)} requests)\n")
        print("| requests | n | direct | normalize on | ceiling |")
        print("|---|--:|--:|--:|--:|")
        for group in direct:
            print(f"| {group} | {len(direct[group])} | {pct(direct[group])} | {pct(normalized[group])} | "
                  f"{pct(top[group])} |")
        print(f"\n`x-kvgate-normalized` seen: {', '.join(f'`{h}`' for h in sorted(headers))}")


if __name__ == "__main__":
    main()
