"""Simulated prefix-cache hits: agent-like sessions rendered to text, hashed in 16-char chained blocks."""

from __future__ import annotations

import hashlib
import json
import random
from datetime import timedelta
from typing import Any

from app.normalize import VolatilityMemory
from tests.normalize.helpers import NOW, STATIC_SYSTEM, run

BLOCK = 16  # characters per block: a trivial tokenizer (one char = one token), vLLM's 16-token blocks
SYSTEM = (STATIC_SYSTEM + "\n") * 3  # ~1.6 KB of static instructions after the volatile header


def tools(rng: random.Random) -> list[dict[str, Any]]:
    """Eight tools; each client request serializes their keys in a different order."""
    out = []
    for name in ("track", "refund", "search", "cancel", "notify", "escalate", "lookup", "update"):
        params = {"type": "object", "properties": {"id": {"type": "string"}, "n": {"type": "integer"}}}
        fn = {"name": name, "description": f"{name} an order", "parameters": params}
        items = list(fn.items())
        rng.shuffle(items)
        out.append({"type": "function", "function": dict(items)})
    rng.shuffle(out)
    return out


def render(body: dict[str, Any]) -> str:
    """A ChatML-like rendering with tools inside the system turn after its text (as Qwen templates do)."""
    parts = []
    for i, msg in enumerate(body["messages"]):
        content = msg["content"]
        if i == 0 and body.get("tools"):
            content += "\n# Tools\n" + "\n".join(json.dumps(t) for t in body["tools"])  # tojson keeps key order
        parts.append(f"<|im_start|>{msg['role']}\n{content}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


def workload(volatile: bool, sessions: int = 8, turns: int = 5) -> list[dict[str, Any]]:
    """Agent sessions: a header with a timestamp and ids (unless `volatile` is False), growing history."""
    rng = random.Random(7)
    requests = []
    n = 0
    for s in range(sessions):
        history: list[dict[str, Any]] = []
        for t in range(turns):
            n += 1
            head = ""
            if volatile:
                ts = (NOW + timedelta(seconds=97 * n)).isoformat()
                rid = f"req_{rng.getrandbits(48):012x}"
                head = f"Current time: {ts}\nRequest ID: {rid}\nSession: sess-{s:04d}x{s * 7919}\n\n"
            history.append({"role": "user", "content": f"Session {s}, question {t}: where is order {1000 + t}?"})
            body = {
                "model": "m",
                "messages": [{"role": "system", "content": head + SYSTEM}, *history],
                "tools": tools(rng) if volatile else sorted(tools(rng), key=lambda x: x["function"]["name"]),
            }
            if not volatile:
                body["tools"] = [json.loads(json.dumps(x, sort_keys=True)) for x in body["tools"]]
            requests.append(body)
            history = [*history, {"role": "assistant", "content": f"Order {1000 + t} ships on day {t + 2}."}]
    return requests


def hit_rate(prompts: list[str]) -> float:
    """Share of prompt characters served from an unlimited prefix cache of chained block hashes."""
    cache: set[bytes] = set()
    hits = total = 0
    for prompt in prompts:
        total += len(prompt)
        parent = b""
        matching = True
        usable = (len(prompt) - 1) // BLOCK  # lookup is capped at n - 1 tokens, full blocks only
        for b in range(len(prompt) // BLOCK):
            parent = hashlib.blake2b(parent + prompt[b * BLOCK : (b + 1) * BLOCK].encode(), digest_size=16).digest()
            if matching and b < usable and parent in cache:
                hits += BLOCK
            else:
                matching = False
            cache.add(parent)
    return hits / total


def normalized(requests: list[dict[str, Any]]) -> list[str]:
    memory = VolatilityMemory()
    return [render(run(body, memory=memory)[0]) for body in requests]


def test_normalized_hit_rate_far_exceeds_raw_and_nears_the_ceiling() -> None:
    raw = hit_rate([render(b) for b in workload(volatile=True)])
    norm = hit_rate(normalized(workload(volatile=True)))
    ceiling = hit_rate([render(b) for b in workload(volatile=False)])
    assert norm > 5 * raw
    assert norm >= 0.9 * ceiling


def test_observe_mode_changes_no_hit_rate() -> None:
    requests = workload(volatile=True, sessions=3, turns=2)
    memory = VolatilityMemory()
    observed = [render(run(b, memory=memory, mode="observe")[0]) for b in requests]
    assert hit_rate(observed) == hit_rate([render(b) for b in requests])
