"""Cross-check `kvgate bench` against vLLM's GuideLLM on the same server, workload and concurrency.

Both tools run closed loops with a fixed request count against one OpenAI-compatible server (by default the
vLLM-CPU `bulk` server of scripts/vllm-cpu.sh), one after the other at each concurrency point:

- kvgate bench: `--workload chat` (one system + one user message per request), `--max-tokens T` and
  `{"ignore_eos": true}`, so every request decodes exactly T tokens.
- GuideLLM: synthetic text whose prompt length is chosen so the server counts the same prompt tokens as the
  bench's mean (the chat template's own tokens are measured with the model's tokenizer and subtracted), and
  `output_tokens=T` (GuideLLM then sends `ignore_eos` and `max_completion_tokens=T` itself).

The tools alternate in ABBA order at each point (--repeats runs each, averaged), and every run reads vLLM's
own generated-token counter before and after, so tokens generated for someone else during a run (the
server is shared) are shown instead of silently skewing the comparison. It compares mean and median TTFT
and output throughput (output tokens / wall time of the run) and prints a table with the relative
difference against the bench. GuideLLM comes from its own venv
(`scripts/peer-venvs.sh guidellm`). Keep it light: the server is shared.

    .venv/bin/python experiments/guidellm_crosscheck.py [--concurrency 1,4] [--requests 10,20] [--output-tokens 64]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache/kvgate"))
GUIDELLM_VENV = CACHE / "guidellm-venv"
KVGATE = ROOT / ".venv/bin/kvgate"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "GUIDELLM__LOGGING__DISABLED": "true"}

# Tokens the chat template wraps around one user message (no system message: SmolLM2's template then adds its
# default system prompt, which is what GuideLLM's chat requests get), printed by the GuideLLM venv's tokenizer.
_TEMPLATE_OVERHEAD = """
import sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
text = "hello world"
wrapped = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
if isinstance(wrapped, dict) or hasattr(wrapped, "input_ids"):
    wrapped = wrapped["input_ids"]
print(len(wrapped) - len(tok(text, add_special_tokens=False)["input_ids"]))
"""


@dataclass
class Point:
    """One tool's figures at one concurrency."""

    requests: int
    prompt_tokens_mean: float
    ttft_mean_ms: float
    ttft_p50_ms: float
    output_tok_s: float
    foreign_tokens: float = 0.0  # tokens the server generated during the run for someone else
    client_cpu_s: float = 0.0  # the tool's own CPU: on 2 cores a heavy client slows the server it measures


def generated_tokens(base_url: str) -> float:
    """vLLM's own counter of generated tokens (all requests, anyone's)."""
    text = urllib.request.urlopen(base_url + "/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


def mean_point(points: list[Point]) -> Point:
    """Field-wise mean of repeated runs of one tool at one concurrency."""
    n = len(points)
    return Point(requests=sum(p.requests for p in points),
                 prompt_tokens_mean=sum(p.prompt_tokens_mean for p in points) / n,
                 ttft_mean_ms=sum(p.ttft_mean_ms for p in points) / n,
                 ttft_p50_ms=sum(p.ttft_p50_ms for p in points) / n,
                 output_tok_s=sum(p.output_tok_s for p in points) / n,
                 foreign_tokens=sum(p.foreign_tokens for p in points),
                 client_cpu_s=sum(p.client_cpu_s for p in points) / n)


def run(cmd: list[str], log: Path, timeout: float) -> float:
    """Run a command, output to `log`; returns its CPU seconds; raises with the log's tail if it fails."""
    print("$ " + shlex.join(cmd), flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                              env={**os.environ, **OFFLINE})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {log.read_text()[-3000:]}")
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def warm(base_url: str, model: str) -> None:
    """One short request so neither tool pays for a cold first request."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    req = urllib.request.Request(base_url + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req, timeout=120).read()


def kvgate_bench(args: argparse.Namespace, concurrency: int, requests: int, tmp: Path, tag: str) -> Point:
    """`kvgate bench` with the chat workload and exactly `--output-tokens` decoded per request."""
    out = tmp / f"kvgate-c{concurrency}-{tag}.json"
    cpu = run([str(KVGATE), "bench", "--base-url", args.base_url, "--model", args.model, "--workload", "chat",
         "--concurrency", str(concurrency), "--requests", str(requests), "--max-tokens", str(args.output_tokens),
         "--extra-body", json.dumps({"ignore_eos": True}), "--seed", str(args.seed), "--json", str(out),
         "--json-summary-only", "--quiet"], tmp / f"kvgate-c{concurrency}-{tag}.log", timeout=args.timeout)
    doc = json.loads(out.read_text())
    s = doc["summary"]
    return Point(requests=s["ok"], prompt_tokens_mean=s["prompt_tokens"] / max(s["ok"], 1),
                 ttft_mean_ms=s["ttft_ms"]["mean"], ttft_p50_ms=s["ttft_ms"]["p50"],
                 output_tok_s=s["output_tokens_per_s"], client_cpu_s=cpu)


def template_overhead(tokenizer: str) -> int:
    """Prompt tokens the server adds around a single user message (chat template)."""
    out = subprocess.run([str(GUIDELLM_VENV / "bin/python"), "-c", _TEMPLATE_OVERHEAD, tokenizer],
                         capture_output=True, text=True, check=True, env={**os.environ, **OFFLINE})
    return int(out.stdout.strip().splitlines()[-1])


def guidellm(args: argparse.Namespace, concurrency: int, requests: int, prompt_tokens: int, tmp: Path,
             tag: str) -> Point:
    """GuideLLM with synthetic prompts of `prompt_tokens` and `--output-tokens` outputs."""
    out = tmp / f"guidellm-c{concurrency}-{tag}.json"
    profile = "kind=synchronous" if concurrency == 1 else f"kind=concurrent,streams={concurrency}"
    cpu = run([str(GUIDELLM_VENV / "bin/guidellm"), "run",
         "--backend", f"kind=openai_http,target={args.base_url},model={args.model},"
                      "request_format=/v1/chat/completions",
         "--profile", profile, "--constraint", f"kind=max_requests,count={requests}",
         "--tokenizer", f"kind=hf_auto,model={args.tokenizer}",
         "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={args.output_tokens}",
         "--seed", f"kind=static,value={args.seed}",
         "--output", f"kind=json,path={out}", "--disable-progress"],
        tmp / f"guidellm-c{concurrency}-{tag}.log", timeout=args.timeout)
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]
    ttft = m["time_to_first_token_ms"]["successful"]
    output = m["output_token_count"]["successful"]
    return Point(requests=int(output["count"]),
                 prompt_tokens_mean=m["prompt_token_count"]["successful"]["mean"],
                 ttft_mean_ms=ttft["mean"], ttft_p50_ms=ttft["median"],
                 output_tok_s=output["total_sum"] / bench["duration"], client_cpu_s=cpu)


def table(rows: list[tuple[int, Point, Point]], tolerance: float) -> str:
    """Markdown: per concurrency and figure, both tools and the relative difference against kvgate bench."""
    lines = [f"| concurrency | figure | kvgate bench | GuideLLM | GuideLLM vs bench | within ±{100 * tolerance:.0f}% |",
             "|---:|---|---:|---:|---:|---|"]
    for c, k, g in rows:
        lines.append(f"| {c} | requests / mean prompt tokens | {k.requests} / {k.prompt_tokens_mean:.1f} | "
                     f"{g.requests} / {g.prompt_tokens_mean:.1f} | - | - |")
        lines.append(f"| {c} | others' tokens generated during the runs | {k.foreign_tokens:.0f} | "
                     f"{g.foreign_tokens:.0f} | - | - |")
        lines.append(f"| {c} | client CPU per run, s (incl. start-up) | {k.client_cpu_s:.1f} | "
                     f"{g.client_cpu_s:.1f} | - | - |")
        for label, a, b in (("TTFT mean, ms", k.ttft_mean_ms, g.ttft_mean_ms),
                            ("TTFT p50, ms", k.ttft_p50_ms, g.ttft_p50_ms),
                            ("output tok/s", k.output_tok_s, g.output_tok_s)):
            diff = (b - a) / a
            lines.append(f"| {c} | {label} | {a:.1f} | {b:.1f} | {100 * diff:+.1f}% | "
                         f"{'yes' if abs(diff) <= tolerance else 'NO'} |")
    return "\n".join(lines)


def main() -> int:
    """Run both tools at each concurrency point and print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8002")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokenizer", default=str(CACHE / "models/smollm2-135m"), help="local tokenizer folder")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", default="10,20", help="requests per run (one value, or one per point)")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="runs per tool and point (ABBA order)")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--timeout", type=float, default=600, help="per tool run, s")
    ap.add_argument("--out-dir", type=Path, help="keep both tools' JSON and logs here")
    args = ap.parse_args()
    if not (GUIDELLM_VENV / "bin/guidellm").exists():
        raise SystemExit(f"{GUIDELLM_VENV} missing: run scripts/peer-venvs.sh guidellm")
    points = [int(c) for c in args.concurrency.split(",")]
    counts = [int(n) for n in args.requests.split(",")]
    counts = counts * len(points) if len(counts) == 1 else counts
    tmp = args.out_dir or Path(tempfile.mkdtemp(prefix="kvgate-guidellm-"))
    tmp.mkdir(parents=True, exist_ok=True)

    overhead = template_overhead(args.tokenizer)
    rows: list[tuple[int, Point, Point]] = []
    for c, n in zip(points, counts, strict=True):
        runs: dict[str, list[Point]] = {"kvgate": [], "guidellm": []}
        prompt = 0
        # ABBA: bench, GuideLLM, GuideLLM, bench (x --repeats/2), so a drift in the shared server's speed
        # during the point hits both tools alike.
        order = (["kvgate", "guidellm", "guidellm", "kvgate"] * args.repeats)[: 2 * max(1, args.repeats)]
        for i, tool in enumerate(order):
            warm(args.base_url, args.model)
            before = generated_tokens(args.base_url)
            if tool == "kvgate":
                point = kvgate_bench(args, c, n, tmp, str(i))
                prompt = prompt or max(1, round(point.prompt_tokens_mean) - overhead)
            else:
                point = guidellm(args, c, n, prompt, tmp, str(i))
            point.foreign_tokens = generated_tokens(args.base_url) - before - point.requests * args.output_tokens
            runs[tool].append(point)
            print(f"  {tool} c={c} run {i}: {point}" + (f"\n  (GuideLLM prompt_tokens={prompt}: bench mean "
                  f"- {overhead} template tokens)" if i == 0 else ""), flush=True)
        rows.append((c, mean_point(runs["kvgate"]), mean_point(runs["guidellm"])))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n{stamp}; {args.base_url} model {args.model}; {args.output_tokens} output tokens per request "
          f"(ignore_eos); files in {tmp}\n")
    print(table(rows, args.tolerance))
    return 0


if __name__ == "__main__":
    sys.exit(main())
