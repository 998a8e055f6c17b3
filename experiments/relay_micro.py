"""Per-chunk cost of the stream relay's observer: today's formatting-independent ChunkObserver against the
compact-bytes-only observer it replaced (frozen below as the baseline), side by side.

Streams in vLLM's compact JSON (what vLLM 0.32 writes): a role chunk, `--tokens` token chunks, a finish chunk,
the usage-only chunk and `data: [DONE]`, with the model name rewritten (served != public) and not. A spaced
stream (`"model": "x"`, as other engines and proxies may write) is timed for the new observer only: the
baseline gets it wrong (leaks the served name, shows the usage chunk), so its time would mean nothing.
The table gives median and best ns per observed event over `--runs` runs (each run a batch of `--streams`
streams, CPU time of the thread so other processes on a shared machine count less, variants interleaved
so load drift hits them alike, gc paused while timing), and both against the
baseline on the same stream (the best of the runs is the steadier figure on a shared machine).

    .venv/bin/python experiments/relay_micro.py [--streams 2000] [--tokens 64] [--runs 7]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from app.context import RequestContext
from app.surfaces import CHAT
from app.surfaces.openai import ChunkObserver, capture_usage, note_choices

SERVED = "Qwen/Qwen2.5-0.5B-Instruct"
PUBLIC = "qwen-small"


class BaselineChunkObserver:
    """The observer before the formatting-independent relay (commit 31b99f8), verbatim but for its name."""

    __slots__ = ("_ctx", "_public_marker", "_rewrite", "_served_marker", "done")

    def __init__(self, ctx: RequestContext, served: str) -> None:
        self._ctx = ctx
        self._served_marker = b'"model":"' + served.encode() + b'"'
        self._public_marker = b'"model":"' + ctx.model.encode() + b'"'
        self._rewrite = served != ctx.model
        self.done = False

    def observe(self, event: bytes) -> bytes | None:
        ctx = self._ctx
        if event.startswith(b"data: [DONE]"):
            self.done = True
            return None
        if not event.startswith(b"data:"):
            return event
        if ctx.timing.first_token and (
            b'"usage":{' not in event and b'"finish_reason":"' not in event and b'"error"' not in event
        ):
            return event.replace(self._served_marker, self._public_marker) if self._rewrite else event
        try:
            doc = orjson.loads(event[5:])
        except orjson.JSONDecodeError:
            return event
        if not isinstance(doc, dict):
            return event
        if ctx.response_id is None:
            ctx.response_id = doc.get("id")
        usage = doc.get("usage")
        choices = doc.get("choices")
        if usage:
            capture_usage(usage, ctx.usage)
        if note_choices(ctx, choices) and not ctx.timing.first_token:
            ctx.timing.first_token = time.perf_counter()
        if usage and not choices and not ctx.client_wants_usage:
            return None
        if "error" in doc:
            ctx.error_type = "upstream_stream_error"
        if self._rewrite:
            event = event.replace(self._served_marker, self._public_marker)
        return event


def stream(tokens: int, *, spaced: bool) -> list[bytes]:
    """One chat stream's SSE events as vLLM writes them (compact), or with spaces after `:` and `,`."""

    def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        doc: dict[str, Any] = {"id": "chatcmpl-0b3c", "object": "chat.completion.chunk", "created": 1767225600,
                               "model": SERVED, "choices": choices}  # fmt: skip
        if usage is not None:
            doc["usage"] = usage
        text = orjson.dumps(doc)
        if spaced:
            text = orjson.dumps(doc, option=orjson.OPT_INDENT_2).replace(b"\n", b"")
        return b"data: " + text + b"\n\n"

    out = [event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                   "finish_reason": None}])]  # fmt: skip
    for i in range(tokens):
        out.append(event([{"index": 0, "delta": {"content": f" tok{i}"}, "logprobs": None, "finish_reason": None}]))
    out.append(event([{"index": 0, "delta": {"content": "."}, "logprobs": None, "finish_reason": "stop"}]))
    out.append(event([], {"prompt_tokens": 812, "total_tokens": 812 + tokens + 1, "completion_tokens": tokens + 1}))
    out.append(b"data: [DONE]\n\n")
    return out


def context(public: str) -> RequestContext:
    """A streaming chat request's context whose client did not ask for usage."""
    return RequestContext(request_id="r", surface=CHAT, path="/v1/chat/completions", body={}, model=public,
                          stream=True, client_wants_usage=False, headers={})  # fmt: skip


Observer = Callable[[RequestContext, str], Any]


def run_batch(make: Observer, events: list[bytes], public: str, streams: int) -> float:
    """ns per event over `streams` streams, each with a fresh context and observer."""
    contexts = [context(public) for _ in range(streams)]
    gc.disable()
    try:
        t0 = time.thread_time_ns()
        for ctx in contexts:
            observe = make(ctx, SERVED).observe
            for ev in events:
                observe(ev)
        elapsed = time.thread_time_ns() - t0
    finally:
        gc.enable()
    return elapsed / (streams * len(events))


def check(events: list[bytes], public: str) -> None:
    """The new observer's output on a stream: public name only, usage chunk hidden, usage captured."""
    ctx = context(public)
    obs = ChunkObserver(ctx, SERVED)
    out = [kept for ev in events if (kept := obs.observe(ev)) is not None]
    leaked = public != SERVED and any(orjson.dumps(SERVED) in o for o in out)
    assert not leaked and obs.done and ctx.usage.reported and not any(b'"usage"' in o for o in out), "wrong relay"


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    compact, spaced = stream(args.tokens, spaced=False), stream(args.tokens, spaced=True)
    for events in (compact, spaced):
        check(events, PUBLIC)
    cases: list[tuple[str, Observer, list[bytes], str]] = [
        ("compact, rewrite: baseline", BaselineChunkObserver, compact, PUBLIC),
        ("compact, rewrite: new", ChunkObserver, compact, PUBLIC),
        ("compact, same name: baseline", BaselineChunkObserver, compact, SERVED),
        ("compact, same name: new", ChunkObserver, compact, SERVED),
        ("spaced, rewrite: new", ChunkObserver, spaced, PUBLIC),
        ("spaced, same name: new", ChunkObserver, spaced, SERVED),
    ]
    samples: dict[str, list[float]] = {name: [] for name, *_ in cases}
    for _name, make, events, public in cases:  # warm-up
        run_batch(make, events, public, max(1, args.streams // 10))
    for _ in range(args.runs):
        for name, make, events, public in cases:
            samples[name].append(run_batch(make, events, public, args.streams))
    print(f"{args.streams} streams x {len(compact)} events ({args.tokens} token chunks), {args.runs} runs")
    print(f"{'variant':<30} {'median ns/event':>16} {'best ns/event':>14} {'median vs base':>15} {'best vs base':>13}")
    medians = {name: statistics.median(v) for name, v in samples.items()}
    bests = {name: min(v) for name, v in samples.items()}
    for name, *_ in cases:
        base = name.split(":")[0].replace("spaced", "compact") + ": baseline"
        print(f"{name:<30} {medians[name]:>16.0f} {bests[name]:>14.0f} {medians[name] / medians[base]:>14.2f}x "
              f"{bests[name] / bests[base]:>12.2f}x")


if __name__ == "__main__":
    main()
