"""What `kvgate bench` itself costs per streamed chunk: its SSE reader against a line-by-line baseline.

A loopback OpenAI-compatible server (tests/bench/fake_openai.py) runs in a child process and streams
`--tokens` chunks to each of `--concurrency` concurrent requests; the bench runs in this process, and its CPU
time (user + system, from getrusage) is divided by the chunks it parsed. The baseline reads the same streams
with `async for line in resp.content` (one await per SSE line) instead of splitting whole network reads.

    .venv/bin/python experiments/bench_client_cost.py                  # 512 streams x 200 tokens, both readers

Seen on this 2-core host under load 9-10: both readers ~27 µs of CPU per chunk (1.03x), the bench at 28% of
one core while the Python fake server, at ~10k chunks/s, was the bottleneck. At that cost one core parses
~37k chunks/s: 512 streams at one token per 14 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.bench import BenchSpec, run_bench  # noqa: E402
from app.bench import client as bench_client  # noqa: E402
from app.bench.apis import apply_usage, chat_delta  # noqa: E402
from app.bench.spec import RequestRecord  # noqa: E402

SERVER = """
import asyncio, sys
from aiohttp import web
from kvlab.fake_openai import FakeOpenAI
fake = FakeOpenAI(tokens=int(sys.argv[2]), first_delay_s=0.0, token_delay_s=float(sys.argv[3]), cached_tokens=0)
web.run_app(fake.app(), host="127.0.0.1", port=int(sys.argv[1]), print=None, backlog=4096)
"""


async def _readline_stream(self: bench_client.BenchClient, resp: aiohttp.ClientResponse, rec: RequestRecord,
                           start: float) -> str:
    """The baseline reader: one await per line."""
    parts: list[str] = []
    last = 0.0
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        event = orjson.loads(data)
        usage = event.get("usage")
        if isinstance(usage, dict):
            apply_usage("chat", rec, usage)
        for choice in event.get("choices") or ():
            text = chat_delta(choice)
            if text is None:
                continue
            now = time.perf_counter()
            parts.append(text)
            rec.token_chunks += 1
            if rec.ttft_s is None:
                rec.ttft_s = now - start
            else:
                rec.itl_s.append(now - last)
            last = now
    rec.e2e_s = time.perf_counter() - start
    rec.ok = True
    return "".join(parts)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(base: str, concurrency: int, requests: int, tokens: int) -> tuple[float, int, float]:
    """(bench CPU seconds, chunks parsed, wall seconds) of one run."""
    spec = BenchSpec(base_url=base, model="fake-model", workload="chat", concurrency=concurrency,
                     requests=requests, max_tokens=tokens)
    cpu0, t0 = _cpu(), time.perf_counter()
    result = await run_bench(spec)
    cpu, wall = _cpu() - cpu0, time.perf_counter() - t0
    assert result.summary.errors == 0, result.summary.error_kinds
    return cpu, sum(r.token_chunks for r in result.records), wall


def main() -> int:
    """Run both readers against the same server; print a table with ratios against the baseline."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--token-delay", type=float, default=0.02, help="seconds between a stream's chunks")
    args = p.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(args.tokens), str(args.token_delay)],
                              cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(base + "/v1/models", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        rows = []
        original = bench_client.BenchClient._read_stream
        for name, reader in (("line-by-line (baseline)", _readline_stream), ("kvgate bench", original)):
            bench_client.BenchClient._read_stream = reader  # type: ignore[method-assign]
            cpu, chunks, wall = asyncio.run(measure(base, args.concurrency, args.requests, args.tokens))
            rows.append((name, cpu, chunks, wall))
        bench_client.BenchClient._read_stream = original  # type: ignore[method-assign]
    finally:
        server.terminate()
        server.wait(timeout=10)
    base_us = rows[0][1] / rows[0][2] * 1e6
    print(f"{args.concurrency} concurrent streams, {args.requests} requests x {args.tokens} chunks\n")
    print("| reader | chunks | wall s | bench CPU s | CPU per chunk | vs baseline | share of one core |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name, cpu, chunks, wall in rows:
        us = cpu / chunks * 1e6
        print(f"| {name} | {chunks:,} | {wall:.1f} | {cpu:.2f} | {us:.1f} µs | {us / base_us:.2f}x | "
              f"{cpu / wall * 100:.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
