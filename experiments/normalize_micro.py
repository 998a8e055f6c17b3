"""Per-request cost of the normalize stage against a baseline of json-copying the request, side by side.

Each variant runs over the same pre-built agent-like chat requests: a ≈2k-token (≈8 KB) system prompt
that starts with a timestamp, a request id and a session id (new values on every request), then static
markdown instructions with numbered rules, a few-shot example and a code block; one user message. The
table gives median and p90 µs per request (each request timed on its own, variants interleaved run by
run so load drift hits them alike, gc paused while timing) and the median's ratio to the baseline.
Variants: json copy (baseline: `json.loads(json.dumps(body))`), normalize off, observe, on (warm memory:
the steady state), on with 8 tools in shuffled key order, on with Claude Code's billing line on top
(`x-anthropic-billing-header: cc_version=…; cc_entrypoint=cli; cch=<5 hex>;`, a new nonce per request:
the learned path, no typed rule matches it), on with the prompt view given (as the pipeline calls it: the
view is built once for the limits stage, so normalize does not build it again), and on with a cold memory
(first request of a tenant).

    .venv/bin/python experiments/normalize_micro.py [--requests 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from app.config import ModelConfig
from app.context import Tenant
from app.normalize import VolatilityMemory, normalize
from app.surfaces import CHAT

TARGET_US = 50.0
NOW = datetime(2026, 11, 30, 1, 0, 0, tzinfo=UTC)
_WORD_TEXT = (
    "the order customer refund policy shipping account support agent answer question carefully always never "
    "check status before after tool call result summary escalate human when unless within delivery address "
    "payment invoice warehouse tracking number item quantity return label carrier update notify"
)
WORDS = _WORD_TEXT.split()


def static_prompt(rng: random.Random, target_chars: int = 8000) -> str:
    """Static instructions in markdown: sections, bullets (some with numbers), an example, a code block."""
    out = ["You are the support agent for Acme Corp. Be precise, friendly and brief.", ""]
    section = 0
    while sum(len(x) + 1 for x in out) < target_chars:
        section += 1
        out.append(f"## Section {section}: " + " ".join(rng.choices(WORDS, k=3)))
        for _ in range(rng.randint(3, 7)):
            words = rng.choices(WORDS, k=rng.randint(8, 24))
            if rng.random() < 0.3:
                words.insert(rng.randrange(len(words)), str(rng.randint(2, 90)))
            out.append("- " + " ".join(words).capitalize() + ".")
        out.append(" ".join(rng.choices(WORDS, k=rng.randint(30, 60))).capitalize() + ".")
        if section == 2:
            out += ["### Example", "Date: 2024-01-05", "User: where is order 1234?", "Assistant: it shipped."]
        if section == 3:
            out += ["```json", '{"order_id": "A-1234", "created": "2024-01-05T10:00:00Z"}', "```"]
        out.append("")
    return "\n".join(out)


def tools(rng: random.Random) -> list[dict[str, Any]]:
    """Eight function tools with their keys in a random order (as different client libraries send them)."""
    out = []
    for name in ("track", "refund", "search", "cancel", "notify", "escalate", "lookup", "update"):
        props = {"order_id": {"type": "string", "description": "the order"}, "limit": {"type": "integer"}}
        fn: dict[str, Any] = {
            "name": name,
            "description": f"{name.capitalize()} an order.",
            "parameters": {"type": "object", "properties": props, "required": ["order_id"]},
        }
        items = list(fn.items())
        rng.shuffle(items)
        out.append({"type": "function", "function": dict(items)})
    rng.shuffle(out)
    return out


def requests(n: int, with_tools: bool, seed: int = 1, billing: bool = False) -> list[dict[str, Any]]:
    """n chat requests sharing the static prompt, each with a fresh volatile header (and billing line)."""
    rng = random.Random(seed)
    static = static_prompt(random.Random(0))
    out = []
    for i in range(n):
        ts = (NOW + timedelta(seconds=7 * i)).isoformat()
        head = (
            f"Current time: {ts}\nRequest ID: req_{rng.getrandbits(64):016x}\n"
            f"Session: {uuid.UUID(int=rng.getrandbits(128))}\n\n"
        )
        if billing:
            nonce = f"{rng.getrandbits(20):05x}"
            head = f"x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch={nonce};\n" + head
        body: dict[str, Any] = {
            "model": "m",
            "messages": [
                {"role": "system", "content": head + static},
                {"role": "user", "content": f"Where is order {1000 + i}?"},
            ],
            "temperature": 0.2,
        }
        if with_tools:
            body["tools"] = tools(rng)
        out.append(body)
    return out


def timed(fn: Callable[[dict[str, Any]], Any], bodies: list[dict[str, Any]]) -> list[float]:
    """Per-request wall time in µs."""
    samples = []
    clock = time.perf_counter
    gc.disable()
    try:
        for body in bodies:
            t0 = clock()
            fn(body)
            samples.append((clock() - t0) * 1e6)
    finally:
        gc.enable()
    return samples


def main() -> None:
    """Run the variants interleaved and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    model = ModelConfig(name="m", pools=["p"])
    plain = requests(args.requests, with_tools=False)
    tooled = requests(args.requests, with_tools=True, seed=2)
    billed = requests(args.requests, with_tools=False, seed=3, billing=True)
    memories = {mode: VolatilityMemory() for mode in ("observe", "on", "on_tools", "on_billing", "on_view")}

    views = {id(b): CHAT.view(b) for b in plain}

    def norm(mode: str, memory_key: str, given_view: bool = False) -> Callable[[dict[str, Any]], Any]:
        tenant = Tenant(id="acme", normalize=mode)  # type: ignore[arg-type]
        memory = memories.get(memory_key)

        def call(body: dict[str, Any]) -> Any:
            mem = memory if memory is not None else VolatilityMemory()
            view = views[id(body)] if given_view else None
            return normalize(
                body, surface=CHAT, view=view, tenant=tenant, model=model, memory=mem, opt_out=False, now=NOW
            )

        return call

    variants: list[tuple[str, Callable[[dict[str, Any]], Any], list[dict[str, Any]]]] = [
        ("json copy (baseline)", lambda b: json.loads(json.dumps(b)), plain),
        ("normalize off", norm("off", "off"), plain),
        ("normalize observe", norm("observe", "observe"), plain),
        ("normalize on", norm("on", "on"), plain),
        ("json copy, 8 tools", lambda b: json.loads(json.dumps(b)), tooled),
        ("normalize on, 8 tools", norm("on", "on_tools"), tooled),
        ("normalize on, billing line", norm("on", "on_billing"), billed),
        ("normalize on, view given", norm("on", "on_view", given_view=True), plain),
        ("normalize on, cold memory", norm("on", "cold"), plain),
    ]
    for _, fn, bodies in variants:  # warm-up: memories learn, caches fill, code paths get hot
        timed(fn, bodies[:50])
    samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(args.runs):
        for name, fn, bodies in variants:
            samples[name].extend(timed(fn, bodies))

    base = statistics.median(samples["json copy (baseline)"])
    base_tools = statistics.median(samples["json copy, 8 tools"])
    prompt = plain[0]["messages"][0]["content"]
    print(
        f"system prompt: {len(prompt)} chars (~{len(prompt) // 4} tokens); "
        f"{args.requests} requests x {args.runs} runs per variant; target: on <= {TARGET_US:.0f} us median"
    )
    print(f"{'variant':<28} {'median us':>10} {'p90 us':>9} {'x json copy':>12}")
    for name, _, _ in variants:
        data = sorted(samples[name])
        med = statistics.median(data)
        p90 = data[int(0.9 * (len(data) - 1))]
        ref = base_tools if "tools" in name else base
        print(f"{name:<28} {med:>10.1f} {p90:>9.1f} {med / ref:>12.2f}")


if __name__ == "__main__":
    main()
