"""The article's table, reproduced with `kvgate bench` against `kvgate sim --profile h100-8b`.

Three engine configurations of the simulated H100 + Llama-3.1-8B replica, each benched with the same
workloads:

  naive         --max-num-seqs 32  --no-enable-prefix-caching
  tuned         --max-num-seqs 256 (prefix caching on, vLLM's default)
  tuned + spec  --max-num-seqs 256 --speculative ngram:3:0.7

  throughput  agent-static (1.5k-token shared system prompt + 8 tools, multi-turn sessions), 256 concurrent
  latency     chat (short Q&A), 4 concurrent

Every request asks for `ignore_eos` so all configurations generate the same number of tokens. Each run gets a
fresh sim in its own process (so the sim and the bench do not share an interpreter). The sims run their clock
slower than real time (--time-scale < 1) so the host CPU keeps up with the modeled step times; `kvgate bench
--time-scale` converts every duration back to modeled time. The sim's own lag counter
(kvgate_sim_step_lateness_seconds) is reported per run: it is the time steps ran past their modeled end.

    .venv/bin/python experiments/article_table.py                # print the tables (about 5 min on a busy 2-core host)
    .venv/bin/python experiments/article_table.py --write docs/measurements/article-table.md --json /tmp/article.json
    .venv/bin/python experiments/article_table.py --quick        # smaller runs, for a smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.bench import BenchResult, BenchSpec, Pricing, run_bench  # noqa: E402
from kvlab.net import free_port  # noqa: E402

GPU_HOUR_USD = 2.50  # one H100-80GB on demand, the gateway config's example price
TABLE_START, TABLE_END = "<!-- article-table:start -->", "<!-- article-table:end -->"


@dataclass(frozen=True)
class Engine:
    """One sim configuration."""

    name: str
    max_num_seqs: int
    prefix_caching: bool
    speculative: str | None = None

    def flags(self) -> list[str]:
        """`kvgate sim` flags for this configuration."""
        out = ["--max-num-seqs", str(self.max_num_seqs)]
        if not self.prefix_caching:
            out.append("--no-enable-prefix-caching")
        if self.speculative:
            out += ["--speculative", self.speculative]
        return out


@dataclass(frozen=True)
class Section:
    """One workload, run against every engine."""

    name: str
    workload: str
    concurrency: int
    requests: int
    warmup: int  # the first wave of a closed loop arrives at once on a cold cache: sent, not measured
    max_tokens: int
    # The sim's clock speed per engine: slow enough that the host keeps up with the modeled steps (a step
    # streams a chunk to every running request, so big batches need the most headroom).
    time_scales: dict[str, float]


ENGINES = (
    Engine("naive", 32, prefix_caching=False),
    Engine("tuned", 256, prefix_caching=True),
    Engine("tuned + spec", 256, prefix_caching=True, speculative="ngram:3:0.7"),
)
SECTIONS = (
    Section("throughput", "agent-static", concurrency=256, requests=256, warmup=256, max_tokens=96,
            time_scales={"naive": 0.6, "tuned": 0.2, "tuned + spec": 0.15}),
    Section("latency", "chat", concurrency=4, requests=24, warmup=4, max_tokens=128,
            time_scales={"naive": 0.2, "tuned": 0.2, "tuned + spec": 0.2}),
)



@contextlib.contextmanager
def sim_process(engine: Engine, time_scale: float) -> Iterator[str]:
    """`kvgate sim --profile h100-8b` with the engine's flags in a child process; yields its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "sim", "--port", str(port), "--profile", "h100-8b",
           "--model", "llama-3.1-8b", "--time-scale", str(time_scale), *engine.flags()]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"sim exited: {err[-500:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("sim did not become healthy in 30 s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sim_metrics(base: str) -> dict[str, float]:
    """The sim's counters we report (Prometheus text, summed over label sets)."""
    wanted = ("kvgate_sim_step_lateness_seconds", "kvgate_sim_modeled_step_seconds", "kvgate_sim_steps",
              "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
              "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
              "vllm:spec_decode_num_drafts_total")
    out: dict[str, float] = {}
    for line in httpx.get(base + "/metrics", timeout=5).text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m and m.group(1) in wanted:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


async def run_one(section: Section, engine: Engine, slowdown: float) -> BenchResult:
    """Bench one engine on one section's workload in a fresh sim; durations in modeled time."""
    scale = section.time_scales[engine.name] / slowdown
    with sim_process(engine, scale) as base:
        spec = BenchSpec(
            base_url=base, workload=section.workload, concurrency=section.concurrency,
            requests=section.requests, warmup=section.warmup, max_tokens=section.max_tokens,
            extra_body={"ignore_eos": True},
            time_scale=scale, pricing=Pricing(gpu_hour_usd=GPU_HOUR_USD, gpus=1), seed=0, timeout_s=600,
        )
        started = time.perf_counter()
        result = await run_bench(spec)
        real_wall = time.perf_counter() - started
        metrics = await asyncio.to_thread(sim_metrics, base)
    lateness = metrics.get("kvgate_sim_step_lateness_seconds", 0.0)
    result.extra.update({
        "engine": engine.name, "section": section.name, "sim_flags": engine.flags(), "real_wall_s": real_wall,
        "sim_lag_share": lateness / real_wall if real_wall > 0 else None, "sim_metrics": metrics,
    })
    return result


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def _ratio(v: float | None, base: float | None) -> str:
    if v is None or base is None or base == 0:
        return "-"
    return f"{v / base:.2f}x"


def markdown_section(section: Section, results: list[BenchResult]) -> str:
    """One section's table, ratios against the naive engine (first row)."""
    base = results[0].summary
    head = (f"**{section.name}** — workload `{section.workload}`, {section.concurrency} concurrent, "
            f"{section.requests} measured requests after {section.warmup} warm-up ones, "
            f"{section.max_tokens} output tokens each (ignore_eos)\n\n")
    rows = [
        "| engine | output tok/s | vs naive | req/s | TTFT p50 / p99 ms | vs naive (p50) | TPOT p50 / p99 ms "
        "| vs naive (p50) | E2E p50 ms | cached | $/M output | vs naive | sim clock | sim lag |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        s = r.summary
        lag = r.extra.get("sim_lag_share")
        rows.append(
            f"| {r.extra['engine']} | {s.output_tokens_per_s:,.0f} "
            f"| {_ratio(s.output_tokens_per_s, base.output_tokens_per_s)} "
            f"| {s.requests_per_s:,.1f} | {_ms(s.ttft_ms.p50)} / {_ms(s.ttft_ms.p99)} "
            f"| {_ratio(s.ttft_ms.p50, base.ttft_ms.p50)} | {_ms(s.tpot_ms.p50)} / {_ms(s.tpot_ms.p99)} "
            f"| {_ratio(s.tpot_ms.p50, base.tpot_ms.p50)} | {_ms(s.e2e_ms.p50)} "
            f"| {(s.cached_ratio or 0) * 100:.0f}% "
            f"| ${s.cost.usd_per_m_output:,.3f} | {_ratio(s.cost.usd_per_m_output, base.cost.usd_per_m_output)} "
            f"| x{r.spec.time_scale:g} | {'-' if lag is None else f'{lag * 100:.0f}%'} |"
        )
    notes = []
    for r in results:
        m = r.extra["sim_metrics"]
        parts = [f"{m.get('vllm:num_preemptions_total', 0):.0f} preemptions"]
        q = m.get("vllm:prefix_cache_queries_total", 0.0)
        if q:
            parts.append(f"prefix-cache hit rate {m.get('vllm:prefix_cache_hits_total', 0.0) / q * 100:.0f}%")
        drafts = m.get("vllm:spec_decode_num_drafts_total", 0.0)
        if drafts:
            acc = m.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
            parts.append(f"mean acceptance length {1 + acc / drafts:.2f}")
        if r.summary.cost.savings_ratio is not None:
            parts.append(f"{r.summary.cost.savings_ratio * 100:.1f}% below the cloud reference price")
        steps = m.get("kvgate_sim_steps", 0.0)
        if steps:
            parts.append(f"mean modeled step {m.get('kvgate_sim_modeled_step_seconds', 0.0) / steps * 1000:.1f} ms")
        notes.append(f"- {r.extra['engine']}: " + ", ".join(parts))
    return head + "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"


def write_doc(path: Path, tables: str) -> None:
    """Replace the table block of the doc (keeping its prose), or create the doc with just the tables."""
    block = f"{TABLE_START}\n{tables}{TABLE_END}"
    if path.exists():
        text = path.read_text()
        if TABLE_START in text and TABLE_END in text:
            pre, rest = text.split(TABLE_START, 1)
            _, post = rest.split(TABLE_END, 1)
            path.write_text(pre + block + post)
            return
    path.write_text(f"# The article's table on kvgate sim\n\n{block}\n")


async def main_async(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """Run every section against every engine; return the markdown tables and every run's summary."""
    sections: tuple[Section, ...] = SECTIONS
    if args.quick:
        sections = tuple(replace(s, requests=max(s.concurrency, s.requests // 4), warmup=s.warmup // 4)
                         for s in SECTIONS)
    chosen = [s for s in sections if not args.only or s.name in args.only]
    engines = [e for e in ENGINES if not args.engine or e.name in args.engine]
    started = time.perf_counter()
    blocks: list[str] = []
    everything: list[dict[str, Any]] = []
    for section in chosen:
        results = []
        for engine in engines:
            print(f"[{time.perf_counter() - started:5.0f}s] {section.name}: {engine.name} ...", file=sys.stderr)
            results.append(await run_one(section, engine, args.slowdown))
        block = markdown_section(section, results)
        print(block)
        blocks.append(block)
        everything += [r.to_dict(records=False) for r in results]
    tables = "\n".join(blocks)
    tables += (f"\nPrice: one GPU at ${GPU_HOUR_USD:.2f}/h; $/M output = GPU $/h / (3600 x output tok/s) x 1e6; "
               "the cloud reference charges $3.00 / $0.30 / $15.00 per M input / cached input / output tokens. "
               f"Times are the sim's modeled time (wall time x sim clock). "
               f"Made by `experiments/article_table.py` in {time.perf_counter() - started:.0f} s of wall time.\n")
    return tables, everything


def main() -> int:
    """CLI entry."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", default=None, help="update the table block of this markdown file")
    p.add_argument("--json", default=None, help="write every run's summary and sim metrics here")
    p.add_argument("--quick", action="store_true", help="a quarter of the requests (smoke test)")
    p.add_argument("--only", action="append", choices=[s.name for s in SECTIONS], help="run only this section")
    p.add_argument("--engine", action="append", choices=[e.name for e in ENGINES], help="run only this engine")
    p.add_argument("--slowdown", type=float, default=1.0,
                   help="run every sim clock this many times slower still (a busy host)")
    args = p.parse_args()
    tables, everything = asyncio.run(main_async(args))
    if args.write:
        write_doc(Path(args.write), tables)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(everything, option=orjson.OPT_INDENT_2))
    errors = sum(int(d["summary"]["errors"]) for d in everything)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
