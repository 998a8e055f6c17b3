"""Per-request cost of exact KV-block prediction (render + tokenize + hash) and of the index lookup.

Requests are agent-like chat bodies for SmolLM2 (~/.cache/kvgate/models/smollm2-135m): a ≈2k-token system
prompt shared by a tenant, 4 tools, and a new user message every request. Each request is timed on its own
(variants interleaved, gc paused while timing); the table shows median and p90 µs and the median's ratio to
the baseline. Variants:
- baseline: a fresh tokenizer `encode` of the rendered text + `block_hashes` (no caches; what a router
  without reuse pays per request)
- cold: RequestBlocks on a request whose prefix it has never seen (new system prompt each time)
- steady: RequestBlocks at steady state (same tenant prefix, new tail), the hot path
- overlap: KvIndex.overlap for the request's hashes on one candidate replica holding the whole prefix,
  index filled with 200k blocks per replica, x8 replicas
Also: memory per indexed block (tracemalloc).

    .venv/bin/python experiments/kv_hash_micro.py [--requests 300] [--block-size 128]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.kvcache.hashing import block_hashes
from app.kvcache.index import KvIndex
from app.kvcache.tokens import RequestBlocks

MODEL = Path.home() / ".cache/kvgate/models/smollm2-135m"
_WORD_TEXT = (
    "the order customer refund policy shipping account support agent answer question carefully always never "
    "check status before after tool call result summary escalate human when unless within delivery address"
)
WORDS = _WORD_TEXT.split()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
    for i in range(4)
]


def system_prompt(rng: random.Random, words: int = 1500) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def body(system: str, rng: random.Random) -> dict[str, Any]:
    user = f"Ticket {uuid.UUID(int=rng.getrandbits(128))}: " + " ".join(rng.choice(WORDS) for _ in range(40))
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], "tools": TOOLS}


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--block-size", type=int, default=128)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2 shared cores: read ratios, not absolute µs)")
    rng = random.Random(7)
    bs = args.block_size
    steady = RequestBlocks(MODEL, bs)
    cold = RequestBlocks(MODEL, bs)
    tok = steady._tokenizer  # the same tokenizers.Tokenizer, for the no-cache baseline
    tenant_system = system_prompt(rng)
    # Warm past the self-check (the first VERIFY_FIRST requests also run a whole-text encode).
    for _ in range(RequestBlocks.VERIFY_FIRST):
        steady.blocks(body(tenant_system, rng))
        cold.blocks(body("warm-up", rng))
    n_tokens = steady.blocks(body(tenant_system, rng)).n_tokens

    index = KvIndex(capacity_blocks=250_000)
    sample_hashes = steady.blocks(body(tenant_system, rng)).hashes
    for r in range(8):
        index.store(f"r{r}", [rng.getrandbits(64) for _ in range(200_000)])
    index.store("r0", sample_hashes)

    results: dict[str, list[float]] = {"baseline": [], "cold": [], "steady": [], "overlap": []}
    gc.disable()
    try:
        for _ in range(args.requests):
            b = body(tenant_system, rng)
            cold_b = body(system_prompt(rng), rng)
            results["baseline"].append(
                timed(lambda b=b: block_hashes(tok.encode(steady.render(b), add_special_tokens=False).ids, bs))
            )
            results["cold"].append(timed(lambda b=cold_b: cold.blocks(b)))
            results["steady"].append(timed(lambda b=b: steady.blocks(b)))
            results["overlap"].append(timed(lambda: index.overlap("r0", sample_hashes)))
    finally:
        gc.enable()

    base = statistics.median(results["baseline"])
    print(f"prompt ≈ {n_tokens} tokens, block size {bs} ({n_tokens // bs} blocks), {args.requests} requests")
    print(f"{'variant':<10} {'median µs':>10} {'p90 µs':>10} {'x baseline':>11}")
    for name, xs in results.items():
        xs = sorted(xs)
        med = statistics.median(xs)
        p90 = xs[int(0.9 * (len(xs) - 1))]
        print(f"{name:<10} {med:>10.1f} {p90:>10.1f} {med / base:>11.3f}")

    tracemalloc.start()
    probe = KvIndex(capacity_blocks=200_000)
    before = tracemalloc.get_traced_memory()[0]
    probe.store("r", [rng.getrandbits(64) for _ in range(100_000)])
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"index memory ≈ {(after - before) / 100_000:.0f} bytes per indexed block (100k blocks, one replica)")


if __name__ == "__main__":
    main()
