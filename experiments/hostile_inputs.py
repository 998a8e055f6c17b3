"""Hostile inputs against a real `kvgate serve` process (in front of one `kvgate sim`): what each gets back and
what the flood does to the process's memory.

  1. header flood: 24 connections each sending ~100 MiB of one header (as fast as the server takes it, until it
     closes the socket); the gateway's RSS before, at its peak (sampled every 20 ms) and after;
  2. a 16 MiB header, `n: 10^9`, nesting 65 ... 5000 levels on every inference endpoint;
  3. a stored response read by another tenant (GET and cancel).

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/hostile_inputs.py [--code DIR --label before]

`--code DIR` runs the gateway from another checkout's app/ (e.g. `git archive <commit> app | tar -x -C DIR`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.procs import MODEL, Proc, from_checkout, gateway_config, gateway_proc, sim_proc  # noqa: E402

ACME, BETA = "sk-hi-acme", "sk-hi-beta"
FLOOD_CONNECTIONS = 24
FLOOD_BYTES = 100 * 1024 * 1024
DEPTHS = (65, 500, 990, 1023, 5000)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def flood_one(port: int, total: int) -> tuple[int, bytes]:
    """One connection sending a header of `total` bytes; (bytes the server took, its first answer bytes)."""
    sent = 0
    chunk = b"a" * (1 << 20)
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nx-flood: ")
            while sent < total:
                s.sendall(chunk)
                sent += len(chunk)
            s.sendall(b"\r\ncontent-length: 2\r\n\r\n{}")
        except OSError:
            pass
        with contextlib.suppress(OSError):
            answer = s.recv(200)
    return sent, answer


def header_flood(gw: Proc, flood_bytes: int) -> dict[str, object]:
    port = int(gw.url.rsplit(":", 1)[1])
    before = rss_mb(gw.pid)
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(gw.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results: list[tuple[int, bytes]] = []
    threads = [threading.Thread(target=lambda: results.append(flood_one(port, flood_bytes)), daemon=True)
               for _ in range(FLOOD_CONNECTIONS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    elapsed = time.monotonic() - t0
    time.sleep(0.5)
    done.set()
    sampler.join()
    statuses = collections.Counter(r[1].split(b" ", 2)[1].decode() if r[1].startswith(b"HTTP/") else "closed"
                                   for r in results)
    return {"rss_before_mb": before, "rss_peak_mb": peak, "rss_after_mb": rss_mb(gw.pid),
            "taken_mib": sum(r[0] for r in results) / 2**20, "statuses": dict(statuses), "seconds": elapsed}


def nested_body(path: str, depth: int) -> bytes:
    deep = b"[" * depth + b'"x"' + b"]" * depth
    m = MODEL.encode()
    if path == "/v1/chat/completions":
        return b'{"model":"%s","messages":[{"role":"user","content":%s}]}' % (m, deep)
    if path == "/v1/completions":
        return b'{"model":"%s","prompt":%s}' % (m, deep)
    if path == "/v1/embeddings":
        return b'{"model":"%s","input":%s}' % (m, deep)
    if path == "/v1/responses":
        return b'{"model":"%s","input":[{"role":"user","content":%s}]}' % (m, deep)
    return b'{"model":"%s","max_tokens":4,"messages":[{"role":"user","content":%s}]}' % (m, deep)


async def probes(url: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    auth = {"authorization": f"Bearer {ACME}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        port = int(url.rsplit(":", 1)[1])
        _, answer = await asyncio.to_thread(flood_one, port, 16 << 20)
        out.append(("16 MiB header", answer.split(b"\r\n", 1)[0].decode() if answer else "closed, no answer"))
        r = await c.post("/v1/chat/completions", headers=auth,
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 10**9})
        out.append(("n: 10^9", str(r.status_code)))
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"):
            codes = []
            for depth in DEPTHS:
                r = await c.post(path, headers=auth, content=nested_body(path, depth))
                codes.append(str(r.status_code))
            out.append((f"nesting {'/'.join(map(str, DEPTHS))} on {path}", " ".join(codes)))
        made = await c.post("/v1/responses", headers=auth, json={"model": MODEL, "input": "Remember 7.",
                                                                 "max_output_tokens": 4})
        rid = made.json().get("id", "none")
        other = {"authorization": f"Bearer {BETA}"}
        own = await c.get(f"/v1/responses/{rid}", headers=auth)
        get = await c.get(f"/v1/responses/{rid}", headers=other)
        cancel = await c.post(f"/v1/responses/{rid}/cancel", headers=other)
        out.append(("stored response: owner GET / other tenant GET / cancel",
                    f"{own.status_code} / {get.status_code} / {cancel.status_code}"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--code", type=Path, default=None, help="run the gateway from this checkout's app/")
    p.add_argument("--label", default="this change")
    p.add_argument("--flood-mib", type=int, default=FLOOD_BYTES >> 20, help="header bytes per flood connection")
    args = p.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-hostile-"))
    sim = sim_proc("sim", ["--enable-responses-store"], time_scale=50, log_dir=log_dir)
    tenants = [{"id": "acme", "api_keys": [ACME]}, {"id": "beta", "api_keys": [BETA]}]
    cfg = gateway_config({"main": {"role": "interactive", "replicas": [sim.url]}}, tenants=tenants)
    cfg["listen"] = {"host": "127.0.0.1"}
    gw = gateway_proc("gw", cfg, log_dir=log_dir)
    if args.code is not None:
        from_checkout(gw, args.code)
    try:
        sim.start(timeout_s=120)
        gw.start("/ready", 120)
        flood = header_flood(gw, args.flood_mib << 20)
        rows = asyncio.run(probes(gw.url))
    finally:
        gw.stop()
        sim.stop()
    print(f"\n## {args.label}\n")
    print(f"header flood: {FLOOD_CONNECTIONS} connections x {args.flood_mib} MiB of one header, "
          f"{flood['seconds']:.1f} s: RSS {flood['rss_before_mb']:.0f} -> peak {flood['rss_peak_mb']:.0f} -> "
          f"{flood['rss_after_mb']:.0f} MiB (growth at peak {flood['rss_peak_mb'] - flood['rss_before_mb']:+.0f} MiB;"  # type: ignore[operator]
          f" clients wrote {flood['taken_mib']:.0f} MiB); answers {flood['statuses']}")
    print("\n| input | status |\n|---|---|")
    for name, status in rows:
        print(f"| {name} | {status} |")
    print(f"\nlogs in {log_dir}")


if __name__ == "__main__":
    main()
