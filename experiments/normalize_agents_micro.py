"""Per-request gateway work on real agent bodies (30-140 KB), this checkout against a baseline commit, side by side.

What is timed is the request-path work the normalize stage changes, on the captured bodies of
tests/fixtures/agents/ (Claude Code over Messages, Codex over Responses, opencode over chat when captured): parse
the raw body (orjson), build the surface's prompt view, `normalize` (tenant mode "on"), build the view again when
it rewrote the body, serialize the upstream body. The rest of the request path (ASGI, tenancy, routing, the
upstream relay, telemetry) is the same code in both and is left out, so the ratio is an upper bound of what the
whole gateway's overhead per request changes by. Each client's captured sessions are replayed in order with one
warm memory (the steady state: the first pass over them teaches it, the timed passes follow), every request timed
on its own, gc paused; the baseline runs from `git archive <ref>` in its own interpreter, the two alternating run
by run so load drift hits both alike. Prints median µs per request and the ratio per client and request kind.

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/normalize_agents_micro.py [--baseline 73924d6] [--runs 5]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "agents"
PATHS = {"/v1/messages": "MESSAGES", "/v1/chat/completions": "CHAT", "/v1/responses": "RESPONSES"}
NOW = datetime(2026, 12, 2, 1, 0, 0, tzinfo=UTC)


def load_requests() -> list[tuple[str, str, str, dict[str, str], bytes]]:
    """(client, kind, path, headers, raw body) of every captured generation request, in capture order."""
    out = []
    for path in sorted(FIXTURES.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("path") in PATHS and isinstance(row.get("body"), dict):
                headers = {k.lower(): v for k, v in (row.get("headers") or {}).items()}
                out.append((path.stem, str(row.get("kind")), row["path"], headers, json.dumps(row["body"]).encode()))
    return out


def worker(passes: int) -> None:
    """Time every captured request in this interpreter (whatever `app` it imports); JSON on stdout."""
    import orjson

    import app
    from app.config import ModelConfig
    from app.context import Tenant
    from app.normalize import VolatilityMemory, normalize

    # The surfaces package moved between versions; ask the tree under test where it is (the editable install's
    # finder would otherwise resolve a package the baseline lacks from this checkout).
    moved = (Path(app.__file__).parent / "surfaces").is_dir()
    surfaces = importlib.import_module("app.surfaces" if moved else "app.api.surfaces")

    takes_headers = "headers" in inspect.signature(normalize).parameters
    tenant = Tenant(id="bench", normalize="on")
    model = ModelConfig(name="m", pools=["fast"])
    requests = load_requests()
    memory = VolatilityMemory()
    times: dict[str, list[float]] = {}

    def one(path: str, headers: dict[str, str], raw: bytes) -> None:
        surface = getattr(surfaces, PATHS[path])
        body = orjson.loads(raw)
        view = surface.view(body)
        kwargs: dict[str, Any] = {"headers": headers} if takes_headers else {}
        out, report = normalize(body, surface=surface, view=view, tenant=tenant, model=model, memory=memory,
                                opt_out=False, now=NOW, **kwargs)
        if report.applied:
            surface.view(out)
        orjson.dumps(surface.upstream_body(out, served_model="m", priority=None, cache_salt="kvg1-x"))

    for _, _, path, headers, raw in requests:  # teach the memory: the steady state is what is timed
        one(path, headers, raw)
    gc.disable()
    for _ in range(passes):
        for client, kind, path, headers, raw in requests:
            t0 = time.perf_counter_ns()
            one(path, headers, raw)
            dt = (time.perf_counter_ns() - t0) / 1000
            for group in (f"{client} {kind}", f"{client} all"):
                times.setdefault(group, []).append(dt)
    gc.enable()
    sizes: dict[str, list[int]] = {}
    for client, kind, _, _, raw in requests:
        for group in (f"{client} {kind}", f"{client} all"):
            sizes.setdefault(group, []).append(len(raw))
    stage = sys.modules[normalize.__module__].__file__
    print(
        json.dumps(
            {
                "app": app.__file__,
                "stage": stage,
                "times": times,
                "sizes": {k: statistics.median(v) for k, v in sizes.items()},
            }
        )
    )


def baseline_tree(ref: str) -> Path:
    """The baseline's `app/` package, extracted once from git into a temp folder."""
    dest = Path(tempfile.gettempdir()) / f"kvgate-baseline-{ref}"
    if not (dest / "app").is_dir():
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "app"], check=True, capture_output=True)
        with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
            tar.extractall(dest, filter="data")
    return dest


def run_worker(tree: Path, passes: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(ROOT / 'experiments')!r}); " \
           f"import normalize_agents_micro as m; m.worker({passes})"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=env, cwd=tree)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="73924d6", help="the commit to compare against")
    ap.add_argument("--runs", type=int, default=5, help="alternating runs per side")
    ap.add_argument("--passes", type=int, default=20, help="passes over the captures per run")
    args = ap.parse_args()
    base_tree = baseline_tree(args.baseline)
    sides: dict[str, dict[str, list[float]]] = {"baseline": {}, "current": {}}
    sizes: dict[str, float] = {}
    for _ in range(args.runs):
        for side, tree in (("baseline", base_tree), ("current", ROOT)):
            result = run_worker(tree, args.passes)
            for module in ("app", "stage"):  # the code under test, not another
                assert result[module].startswith(str(tree)), (side, result[module])
            sizes.update(result["sizes"])
            for group, values in result["times"].items():
                sides[side].setdefault(group, []).extend(values)
    print(f"baseline {args.baseline} vs this checkout; {args.runs} runs x {args.passes} passes; µs per request\n")
    print("| client, request kind | body KB (median) | baseline p50 | current p50 | ratio p50 | baseline p90 | "
          "current p90 | ratio p90 |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for group in sorted(sides["current"]):
        b, c = sides["baseline"].get(group, []), sides["current"][group]
        if not b:
            continue
        bp50, cp50 = statistics.median(b), statistics.median(c)
        bp90, cp90 = statistics.quantiles(b, n=10)[-1], statistics.quantiles(c, n=10)[-1]
        print(f"| {group} | {sizes[group] / 1024:.0f} | {bp50:,.0f} | {cp50:,.0f} | {cp50 / bp50:.2f}x | "
              f"{bp90:,.0f} | {cp90:,.0f} | {cp90 / bp90:.2f}x |")


if __name__ == "__main__":
    main()
