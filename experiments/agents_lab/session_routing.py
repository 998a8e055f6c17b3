"""Session-aware routing on real client traffic (issue 21): 12 concurrent sessions of Claude Code, Codex and
opencode (4 each, replayed from tests/fixtures/agents) over 4 `kvgate sim` replicas, per arm on fresh sims:

  kvgate          kvgate, default policy (prefix_affinity), routing.sessions on (the default)
  kvgate-nosess   the same with routing.sessions.enabled: false (request-level bounded prefix affinity: before)
  kvgate-kv       kvgate, kv_events policy (the sims publish KV events), sessions on
  round-robin     kvgate, round_robin
  vllm-router     vLLM's router 0.1.17, --policy cache_aware (scripts/peer-venvs.sh vllm-router); it forwards
                  Messages and Responses bodies too (a failed request would count as such)
  big             one replica with the KV blocks and sequence slots of all four, straight (the cache ceiling)

Each replayed session is a captured `main` session (6 turns: the turn-opening request and the tool result, plus
opencode's title request) made its own: its ids (session headers, prompt_cache_key, metadata) and each turn's
text carry the session's number, so sessions of one client share the system prompt and tools, not the history.
Sessions run concurrently, each sending its next request when the last one answered; they start in the order
`--order` says: `mixed` (claude-0, codex-1, opencode-2, claude-3, ...: new sessions of different clients
interleaved, as a team's traffic is) or `grouped` (all of one client's sessions, then the next client's: the
adversary for any placement that balances as sessions arrive, since the first four are of one client). A tap (layer.py
--passthrough) in front of every replica records which session each request was and the sim's usage, so every
arm is measured the same way, whatever routed it.

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/agents_lab/session_routing.py \
        [--arms kvgate,kvgate-nosess,kvgate-kv,round-robin,vllm-router,big] [--order mixed|grouped] [--json F] \
        [--clients claude,codex,opencode,qwen --per-client 3]

Reported per arm: requests answered 200; per session the share of its requests on its most used replica (min,
and how many sessions are at >= 95 %); requests per replica max/mean; cached/prompt over all requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from procs import Proc, free_port  # noqa: E402
from run import API_KEY, gateway_cfg, start_gateway, start_layer, start_sim  # noqa: E402

FIXTURES = HERE.parent.parent / "tests" / "fixtures" / "agents"
CLIENTS = ("claude", "codex", "opencode")
ARMS = ("kvgate", "kvgate-nosess", "round-robin", "vllm-router", "big")  # and kvgate-kv
CACHE = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache/kvgate"))
TOKENIZER = CACHE / "models" / "smollm2-135m"
SKIP = {"host", "content-length", "connection", "accept-encoding", "authorization", "x-api-key"}
UUID_HEAD = "00000000-0000-4000-8000-"
OPENCODE_SESSION = re.compile(r"ses_[0-9A-Za-z]{20,}")
LABEL = re.compile(r"Turn \d+ \[([a-z]+-\d+)\]:")
# SmolLM2's own template renders neither tools nor tool calls (a tool turn fails it: 400 "chat template failed"),
# so the kvgate-kv arm's sims and gateway share this Hermes-style one over SmolLM2's tokenizer.
KV_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}

{% endif %}# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools><|im_end|>
{% elif messages and messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}{% if not (loop.first and message['role'] == 'system') %}<|im_start|>{{ message['role'] }}
{% if message['content'] is defined and message['content'] %}{{ message['content'] }}{% endif %}
{%- if message['tool_calls'] is defined and message['tool_calls'] %}{% for call in message['tool_calls'] %}
<tool_call>
{{ call | tojson }}
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""


def session_requests(client: str, index: int) -> list[dict[str, Any]]:
    """The client's captured main session, made session `index`'s own (ids and turn texts)."""
    path = FIXTURES / f"{client}.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    label = f"{client}-{index}"
    out = []
    for rec in recs:
        if rec.get("session") != "main" or not rec.get("api") or not isinstance(rec.get("body"), dict):
            continue
        text = json.dumps({"headers": rec["headers"], "body": rec["body"]})
        text = text.replace(UUID_HEAD, f"{index + 1:08x}-0000-4000-8000-")
        text = OPENCODE_SESSION.sub(f"ses_lab{index:04d}xxxxxxxxxxxxxxxxxxxx", text)
        text = re.sub(r"Turn (\d+):", rf"Turn \1 [{label}]:", text)
        doc = json.loads(text)
        out.append({"path": rec["path"], "query": rec["query"], "api": rec["api"], "kind": rec["kind"],
                    "headers": {k: v for k, v in doc["headers"].items() if k.lower() not in SKIP},
                    "body": doc["body"], "label": label})
    return out


async def replay_session(client: httpx.AsyncClient, base: str, reqs: list[dict[str, Any]],
                         routes: list[str]) -> list[int]:
    """Send one session's requests in order, each after the last answered; their statuses (the gateway's
    x-kvgate-route headers appended to `routes`)."""
    statuses = []
    for req in reqs:
        headers = dict(req["headers"])
        if req["api"] == "messages":
            headers["x-api-key"] = API_KEY
        else:
            headers["authorization"] = f"Bearer {API_KEY}"
        url = base + req["path"] + (f"?{req['query']}" if req["query"] else "")
        try:
            r = await client.post(url, json=req["body"], headers=headers)
            await r.aread()
            statuses.append(r.status_code)
            if "x-kvgate-route" in r.headers:
                routes.append(r.headers["x-kvgate-route"])
        except httpx.HTTPError:
            statuses.append(-1)
    return statuses


def tap_records(paths: list[Path]) -> list[dict[str, Any]]:
    """Every generation request the taps saw: replica index, session label, cached, prompt."""
    out = []
    for i, path in enumerate(paths):
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if not rec.get("api") or rec.get("status") != 200:
                continue
            found = LABEL.search(json.dumps(rec.get("body")))
            out.append({"replica": i, "label": found.group(1) if found else "?", "cached": rec.get("cached") or 0,
                        "prompt": rec.get("prompt") or 0})
    return out


def kv_model(out: Path) -> Path:
    """A model folder for the kvgate-kv arm: SmolLM2's tokenizer and configs, KV_TEMPLATE as the chat template."""
    folder = out / "kv-model"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        if (TOKENIZER / name).exists():
            (folder / name).write_bytes((TOKENIZER / name).read_bytes())
    (folder / "chat_template.jinja").write_text(KV_TEMPLATE)
    return folder


def start_front(arm: str, sims: list[Proc], taps: list[Proc], logs: Path) -> Proc | None:
    """The router in front of the taps (None: the big arm, straight to its one tap)."""
    urls = [t.url for t in taps]
    if arm == "big":
        return None
    if arm == "vllm-router":
        exe = CACHE / "vllm-router-venv" / "bin" / "vllm-router"
        if not exe.exists():
            raise SystemExit(f"{exe} missing: run scripts/peer-venvs.sh vllm-router")
        port, prom = free_port(), free_port()
        argv = [str(exe), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls, "--policy",
                "cache_aware", "--prometheus-port", str(prom), "--log-level", "warning",
                "--health-check-interval-secs", "2"]
        return Proc(arm, f"http://127.0.0.1:{port}", argv, log=logs / f"{arm}.log").start("/health", 60,
                                                                                        any_status=True)

    policy = {"kvgate": "prefix_affinity", "kvgate-nosess": "prefix_affinity", "round-robin": "round_robin"}.get(
        arm, "prefix_affinity")
    # Probes every 0.5 s, but 5 s to answer: a sim tokenizing 100 KB bodies on a starved 2-core host answers
    # /health late, and the default 1 s timeout (two intervals) took such a replica out of rotation in the first
    # kvgate-kv run, which moved its three sessions (this measures routing, not health detection).
    routing: dict[str, Any] = {"probe_interval_s": 0.5, "probe_timeout_min_s": 5.0}
    if arm == "kvgate-nosess":
        routing["sessions"] = {"enabled": False}
    cfg = gateway_cfg(urls, "off", policy, routing)
    if arm == "kvgate-kv":
        # Exact block hashes need the engine's tokenizer; the gateway computes them for chat bodies (opencode),
        # Messages and Responses requests fall back to prefix affinity.
        pool = cfg["pools"]["main"]
        pool.update(policy={"type": "kv_events", "block_size": 16}, tokenizer=str(kv_model(logs.parent)), replicas=[
            {"url": t.url, "kv_events": f"tcp://127.0.0.1:{s.kv_ports[0]}",  # type: ignore[attr-defined]
             "kv_replay": f"tcp://127.0.0.1:{s.kv_ports[1]}", "kv_topic": "kv"}  # type: ignore[attr-defined]
            for t, s in zip(taps, sims, strict=True)])
    return start_gateway(logs, f"{arm}-gateway", cfg)


def run_arm(arm: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Fresh sims + taps + front; the 12 sessions concurrently; the measures."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    n = 1 if arm == "big" else args.replicas
    procs: list[Proc] = []
    caps = [out / f"{arm}-tap{i}.jsonl" for i in range(n)]
    for c in caps:
        c.unlink(missing_ok=True)
    try:
        sims = []
        for i in range(n):
            extra = ["--max-num-seqs", str(args.max_num_seqs * args.replicas), "--kv-blocks",
                     str(args.kv_blocks * args.replicas)] if arm == "big" else [
                "--max-num-seqs", str(args.max_num_seqs), "--kv-blocks", str(args.kv_blocks)]
            ports = (free_port(), free_port())
            if arm == "kvgate-kv":
                extra += ["--tokenizer", str(kv_model(out)), "--kv-events", f"tcp://*:{ports[0]}", "--kv-replay",
                          f"tcp://*:{ports[1]}", "--kv-topic", "kv"]
            sim = start_sim(logs, f"{arm}-sim{i}", args.time_scale, extra)
            sim.kv_ports = ports  # type: ignore[attr-defined]
            sims.append(sim)
            procs.append(sim)
        taps = []
        for i, sim in enumerate(sims):
            tap = start_layer(logs, f"{arm}-tap{i}", sim.url, caps[i], passthrough=True)
            taps.append(tap)
            procs.append(tap)
        front = start_front(arm, sims, taps, logs)
        if front is not None:
            procs.append(front)
        base = front.url if front is not None else taps[0].url
        clients = args.clients.split(",")
        order = ([c for _ in range(args.per_client) for c in clients] if args.order == "mixed"
                 else [c for c in clients for _ in range(args.per_client)])
        sessions = [session_requests(c, i) for i, c in enumerate(order)]

        routes: list[str] = []

        async def go() -> list[list[int]]:
            async with httpx.AsyncClient(timeout=300) as client:
                return await asyncio.gather(*(replay_session(client, base, s, routes) for s in sessions))

        statuses = asyncio.run(go())
    finally:
        for p in reversed(procs):
            p.stop()
    recs = tap_records(caps)
    by_session: dict[str, Counter[int]] = defaultdict(Counter)
    for r in recs:
        by_session[r["label"]][r["replica"]] += 1
    shares = {s: max(c.values()) / sum(c.values()) for s, c in by_session.items()}
    per_replica = Counter(r["replica"] for r in recs)
    loads = [per_replica.get(i, 0) for i in range(n)]
    flat = [s for ss in statuses for s in ss]
    cached, prompt = sum(r["cached"] for r in recs), sum(r["prompt"] for r in recs)
    # The route header's pick (session_new / session_home / session_moved / ...) and retries, where kvgate decided.
    fields = [dict(f.split("=", 1) for f in r.split(";") if "=" in f) for r in routes]
    reasons = Counter(f.get("pick", "?") + (f" (attempt {f['attempt']})" if f.get("attempt", "1") != "1" else "")
                      for f in fields)
    return {"arm": arm, "requests": len(flat), "reasons": dict(reasons), "ok": sum(1 for s in flat if s == 200),
            "status_counts": dict(Counter(flat)), "sessions": len(sessions),
            "min_share": min(shares.values()) if shares else 0.0,
            "sessions_95": sum(1 for v in shares.values() if v >= 0.95),
            "max_over_mean": max(loads) / statistics.mean(loads) if loads and statistics.mean(loads) else 0.0,
            "loads": loads, "cached": cached, "prompt": prompt,
            "ratio": cached / prompt if prompt else 0.0, "shares": shares}


def table(rows: list[dict[str, Any]]) -> str:
    """The arms side by side."""
    out = ["| arm | 200 / requests | sessions >= 95 % on one replica | min share | requests per replica | "
           "max/mean | cached/prompt |", "|---|--:|--:|--:|---|--:|--:|"]
    for r in rows:
        out.append(f"| {r['arm']} | {r['ok']}/{r['requests']} | {r['sessions_95']}/{r['sessions']} | "
                   f"{100 * r['min_share']:.0f}% | {' '.join(map(str, r['loads']))} | {r['max_over_mean']:.2f} | "
                   f"{100 * r['ratio']:.1f}% |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--per-client", type=int, default=4)
    p.add_argument("--clients", default=",".join(CLIENTS),
                   help="whose captured sessions (tests/fixtures/agents), e.g. claude,codex,opencode,qwen")
    p.add_argument("--order", default="mixed", choices=["mixed", "grouped"], help="the sessions' start order")
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--kv-blocks", type=int, default=25_000, help="per replica (16-token blocks)")
    p.add_argument("--out", type=Path, default=Path("/work/agents-captures/session-routing"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    rows = []
    for arm in args.arms.split(","):
        rows.append(run_arm(arm, args.out, args))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
