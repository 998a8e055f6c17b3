"""Cost per request of the pre-warm memory's bookkeeping (PrefixMemory.record) on an agent turn, side by side.

record runs on every routed request, after the upstream answered and before the reply's first byte. Arms, run
interleaved on the same bodies: `off` (histories off: prefix counting only), `kept` (histories on: the request
is kept by reference, sized by its prompt view, as the gateway does), `built` (what keeping a ready replay costs:
the surface's warm_history on every request, as the first history pre-warm did). The table's ratios are against
`off`.

    .venv/bin/python experiments/prewarm_record_micro.py [--messages 300] [--calls 3000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from app.config.prewarm import PrewarmConfig
from app.prewarm.memory import PrefixMemory
from app.surfaces import CHAT, MESSAGES
from app.surfaces.base import Surface


def chat_turn(n: int) -> dict[str, Any]:
    """A coding agent's chat turn: system prompt, task, then n-2 tool calls and results."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. " * 60},
                                  {"role": "user", "content": "Fix the failing test in tests/test_x.py."}]  # fmt: skip
    for i in range((n - 2) // 2):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "def f(x):\n    return x\n" * 20})
    return {"model": "m", "messages": msgs}


def messages_turn(n: int) -> dict[str, Any]:
    """The same session in Anthropic Messages shape (tool_use / tool_result blocks)."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test in tests/test_x.py."}]
    for i in range((n - 2) // 2):
        msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "read",
                                                       "input": {"path": "a.py"}}]})  # fmt: skip
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                                  "content": "def f(x):\n    return x\n" * 20}]})  # fmt: skip
    return {"model": "m", "max_tokens": 256, "system": "You are a coding agent. " * 60, "messages": msgs}


def arms(surface: Surface, body: dict[str, Any]) -> dict[str, Callable[[], None]]:
    """One callable per arm, each recording `body` as the gateway's next request of the same key."""
    off = PrefixMemory(PrewarmConfig(history_budget_chars=0))
    kept = PrefixMemory(PrewarmConfig())
    view = surface.view(body)  # the gateway computed it already (ctx.prompt)
    for mem in (off, kept):
        mem.record("p", "t", 1, body, None, surface, view)

    def built() -> None:
        kept.record("p", "t", 1, body, None, surface, view)
        surface.warm_history(body, 400_000)

    return {
        "off": lambda: off.record("p", "t", 1, body, None, surface, view),
        "kept": lambda: kept.record("p", "t", 1, body, None, surface, view),
        "built": built,
    }


def main() -> None:
    """Print µs per record for each arm and surface, and the ratio to `off`."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    print("| surface | messages | arm | µs/record (median of 7) | x off |\n|---|---|---|---|---|")
    for name, surface, body in (("chat", CHAT, chat_turn(args.messages)),
                                ("messages", MESSAGES, messages_turn(args.messages))):  # fmt: skip
        fns = arms(surface, body)
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(7):  # interleaved rounds: machine noise hits every arm alike
            for arm, fn in fns.items():
                t = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                samples[arm].append((time.perf_counter() - t) / args.calls * 1e6)
        base = statistics.median(samples["off"])
        for arm, xs in samples.items():
            us = statistics.median(xs)
            print(f"| {name} | {args.messages} | {arm} | {us:.2f} | {us / base:.1f}x |")


if __name__ == "__main__":
    main()
