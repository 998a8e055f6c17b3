"""The chat-template render of the kv_events pick against transformers' own setup, side by side.

Baseline: jinja2's ImmutableSandboxedEnvironment as transformers builds it, every message copied (what
RequestBlocks did before). Now: RequestBlocks.render (sandbox verdicts memoized per (type, attribute),
unchanged messages handed over uncopied). Same bodies as experiments/kv_pick_micro.py (agent-static, later
turns of ≈ 2k tokens), interleaved per body; the outputs are asserted byte-identical first.

    .venv/bin/python experiments/kv_render_micro.py [--bodies 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.kvcache.chat_template import load_chat_template
from app.kvcache.tokens import RequestBlocks
from experiments.kv_pick_micro import MODEL, agent_bodies


def copied(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every message copied, as the baseline did (these bodies carry string contents only)."""
    return [dict(m) for m in messages]


def main() -> None:
    """Render every body both ways, interleaved, and print the medians."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bodies", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at start: {load} (2 shared cores: read the ratio)")
    rb = RequestBlocks(MODEL, 16)
    bodies = [b for _, b in agent_bodies(args.bodies, 2000, rb)]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    baseline = env.from_string(load_chat_template(MODEL, {}))
    config = json.loads((MODEL / "tokenizer_config.json").read_text())
    keys = ("bos_token", "eos_token", "pad_token", "unk_token")
    special = {k: v for k in keys if isinstance(v := config.get(k), str)}

    def old(b: dict[str, Any]) -> str:
        return str(baseline.render(messages=copied(b["messages"]), tools=b.get("tools"), add_generation_prompt=True,
                                   continue_final_message=False, **special))

    assert all(old(b) == rb.render(b) for b in bodies), "renders differ"
    times: dict[str, list[float]] = {"transformers' sandbox, messages copied": [], "RequestBlocks.render": []}
    for _ in range(args.rounds):
        for b in bodies:
            t0 = time.perf_counter_ns()
            old(b)
            t1 = time.perf_counter_ns()
            rb.render(b)
            t2 = time.perf_counter_ns()
            times["transformers' sandbox, messages copied"].append((t1 - t0) / 1000)
            times["RequestBlocks.render"].append((t2 - t1) / 1000)
    base = statistics.median(times["transformers' sandbox, messages copied"])
    print(f"{len(bodies)} bodies x {args.rounds}, outputs byte-identical")
    print(f"{'variant':<40} {'median µs':>10} {'x baseline':>11}")
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"{name:<40} {med:>10.1f} {med / base:>10.2f}x")


if __name__ == "__main__":
    main()
