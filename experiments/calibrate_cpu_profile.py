"""Fit the `cpu-smollm2` step-time profile against a real vLLM-CPU server (bounded, modest load).

Measures, on one server:
  prefill  TTFT of uncached prompts of N tokens (max_tokens=1)         -> base + prefill_token_s * N
  decode   mean inter-chunk gap of B concurrent 48-token streams       -> base + decode_seq_s * B
  kv       the same at batch 1 with a long context                      -> kv_token_s
and, when --spec-url is given, the per-step cost of ngram speculation at batch 1 on that server.
Prints the measurements, the fitted constants and, with --sim-url, the same measurements on a sim side by side.

    .venv/bin/python experiments/calibrate_cpu_profile.py --url http://127.0.0.1:8002 --spec-url http://127.0.0.1:8001
    .venv/bin/python experiments/calibrate_cpu_profile.py --url http://127.0.0.1:8002 \
        --sim-url http://127.0.0.1:9100     # kvgate sim --profile cpu-smollm2 --port 9100 ...

Every run sends < 100 requests of <= 48 output tokens and stops after --budget-s seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

PREFILL_SIZES = (64, 512, 1024, 1536, 1900)
DECODE_BATCHES = (1, 2, 4, 8, 16)


@dataclass
class Timing:
    """One streamed request: TTFT and the gaps between content chunks."""

    ttft: float
    gaps: list[float]
    tokens: int


async def _model(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/v1/models") as r:
        return str((await r.json())["data"][0]["id"])


def _prompt(rng: random.Random, n: int) -> list[int]:
    # Random ids in a plain-text range: unique per request, so nothing hits the prefix cache.
    return [rng.randrange(1000, 40000) for _ in range(n)]


async def stream_once(
    session: aiohttp.ClientSession, url: str, model: str, prompt: list[int] | str, max_tokens: int
) -> Timing:
    """One streaming completion with ignore_eos; chunk arrival times."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                            "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            obj = orjson.loads(line[6:])
            if obj.get("choices"):
                stamps.append(time.perf_counter())
            elif obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return Timing(stamps[0] - t0, gaps, tokens)


async def prefill(session: aiohttp.ClientSession, url: str, model: str, rng: random.Random) -> list[tuple[int, float]]:
    """(prompt tokens, TTFT) for uncached prompts."""
    out = []
    for n in PREFILL_SIZES * 2:
        t = await stream_once(session, url, model, _prompt(rng, n), 1)
        out.append((n, t.ttft))
    return out


async def prefix_prefill(
    session: aiohttp.ClientSession, url: str, model: str, rng: random.Random, ctx: int = 1024
) -> list[tuple[int, float]]:
    """(new tokens, TTFT) for prompts that extend a cached `ctx`-token prefix."""
    prefix = _prompt(rng, ctx)
    await stream_once(session, url, model, prefix + _prompt(rng, 8), 1)  # caches the prefix
    out = []
    for n in (32, 256, 640, 32, 256, 640):
        t = await stream_once(session, url, model, prefix + _prompt(rng, n), 1)
        out.append((n, t.ttft))
    return out


async def decode(
    session: aiohttp.ClientSession, url: str, model: str, rng: random.Random, batch: int, ctx: int = 32
) -> float:
    """Median inter-chunk gap with `batch` concurrent streams (steady state: middle of the streams)."""
    res = await asyncio.gather(*(stream_once(session, url, model, _prompt(rng, ctx), 48) for _ in range(batch)))
    gaps = [g for t in res for g in t.gaps[8:-8]]
    return statistics.median(gaps)


def fit_quadratic(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares y = a + b x + c x^2 (prefill: per-token work plus attention over the prompt so far)."""
    import numpy as np

    x = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    coef, *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x, x * x], axis=1), y, rcond=None)
    return float(coef[0]), float(coef[1]), float(coef[2])


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line y = a + b x."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


async def spec_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The spec-decode counters of a server."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                     "spec_decode_num_accepted_tokens_total"):
            if line.startswith(f"vllm:{name}{{"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


async def measure(url: str, seed: int, budget_s: float) -> dict[str, Any]:
    """Every measurement against one server."""
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=budget_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        model = await _model(session, url)
        # Prompts must miss the cache: start from an empty one (vLLM answers {"success": ...}).
        async with session.post(url + "/reset_prefix_cache") as r:
            await r.read()
        await stream_once(session, url, model, _prompt(rng, 16), 4)  # warm-up
        pre = await prefill(session, url, model, rng)
        pre_ctx = await prefix_prefill(session, url, model, rng)
        dec = [(b, await decode(session, url, model, rng, b)) for b in DECODE_BATCHES]
        long_ctx = await decode(session, url, model, rng, 1, ctx=1536)
    return {"prefill": pre, "prefix_prefill": pre_ctx, "decode": dec, "long_ctx_gap": long_ctx}


async def measure_spec(url: str, seed: int, budget_s: float) -> dict[str, Any]:
    """Batch-1 gap and acceptance on a speculative server, for a repetitive prompt (ngram drafts often)."""
    rng = random.Random(seed)
    code = "def add(a, b):\n    return a + b\n\n" * 12
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=budget_s)) as session:
        model = await _model(session, url)
        before = await spec_metrics(session, url)
        rep = [await stream_once(session, url, model, "Repeat this code:\n" + code, 48) for _ in range(3)]
        mid = await spec_metrics(session, url)
        rnd = [await stream_once(session, url, model, _prompt(rng, 64), 48) for _ in range(3)]
        after = await spec_metrics(session, url)
    def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: b.get(k, 0) - a.get(k, 0) for k in b}
    def tokens_per_chunk(ts: list[Timing]) -> float:
        return sum(t.tokens for t in ts) / sum(len(t.gaps) + 1 for t in ts)
    return {
        "repetitive_gap": statistics.median(g for t in rep for g in t.gaps),
        "repetitive_tokens_per_chunk": tokens_per_chunk(rep),
        "repetitive_counters": delta(before, mid),
        "random_gap": statistics.median(g for t in rnd for g in t.gaps),
        "random_tokens_per_chunk": tokens_per_chunk(rnd),
        "random_counters": delta(mid, after),
    }


def report(name: str, m: dict[str, Any]) -> dict[str, float]:
    """Print one server's measurements; return the fitted constants."""
    a_pre, b_pre, c_pre = fit_quadratic([(float(n), t) for n, t in m["prefill"]])
    a_dec, b_dec = fit([(float(b), g) for b, g in m["decode"]])
    short_ctx = 32 + 24  # mid-stream context of the decode runs
    kv = max((m["long_ctx_gap"] - m["decode"][0][1]) / (1536 - short_ctx), 0.0)
    print(f"\n== {name}")
    print("prefill  N  TTFT_ms: " + "  ".join(f"{n}:{t * 1e3:.0f}" for n, t in m["prefill"]))
    a_ctx, b_ctx = fit([(float(n), t) for n, t in m["prefix_prefill"]])
    print("prefill after a cached 1024-token prefix, N TTFT_ms: "
          + "  ".join(f"{n}:{t * 1e3:.0f}" for n, t in m["prefix_prefill"]))
    print(f"  -> per new token with 1024 cached: {b_ctx * 1e3:.3f} ms (uncached fit at N=1024: "
          f"{(b_pre + 2 * c_pre * 1024) * 1e3:.3f} ms marginal)")
    print("decode   B  gap_ms : " + "  ".join(f"{b}:{g * 1e3:.1f}" for b, g in m["decode"]))
    print(f"long ctx (1536) gap at B=1: {m['long_ctx_gap'] * 1e3:.1f} ms")
    fitted = {"ttft_intercept_s": a_pre, "prefill_token_s": b_pre, "prefill_attn_s": c_pre,
              "prefix_ttft_intercept_s": a_ctx, "prefix_token_s": b_ctx, "base_s": a_dec,
              "decode_seq_s": b_dec, "kv_token_s": kv}
    print("fitted: " + ", ".join(f"{k}={v:.3g}" for k, v in fitted.items()))
    return fitted


async def main() -> None:
    """Run the measurements and print the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8002", help="a real vLLM-CPU server (no speculation)")
    p.add_argument("--spec-url", default=None, help="a real vLLM-CPU server with ngram speculation")
    p.add_argument("--sim-url", default=None, help="a kvgate sim --profile cpu-smollm2 to compare")
    p.add_argument("--seed", type=int, default=None, help="prompt seed (default: the clock, so nothing is cached)")
    p.add_argument("--budget-s", type=float, default=240.0, help="hard time bound per server")
    args = p.parse_args()
    if args.seed is None:
        args.seed = time.time_ns()
    real = await measure(args.url, args.seed, args.budget_s)
    fr = report(f"real {args.url}", real)
    if args.spec_url:
        s = await measure_spec(args.spec_url, args.seed, args.budget_s)
        print(f"\n== spec {args.spec_url}")
        for k, v in s.items():
            print(f"{k}: {v}")
    if args.sim_url:
        sim = await measure(args.sim_url, args.seed, args.budget_s)
        fs = report(f"sim {args.sim_url}", sim)
        print("\nsim/real ratios: " + ", ".join(f"{k}={fs[k] / fr[k]:.2f}" for k in fr if fr[k]))
        print("TTFT ratio per N: " + "  ".join(f"{n}:{s_t / r_t:.2f}" for (n, r_t), (_, s_t)
                                                in zip(real["prefill"], sim["prefill"], strict=True)))
        print("gap ratio per B:  " + "  ".join(f"{b}:{s_g / r_g:.2f}" for (b, r_g), (_, s_g)
                                                in zip(real["decode"], sim["decode"], strict=True)))


if __name__ == "__main__":
    asyncio.run(main())
