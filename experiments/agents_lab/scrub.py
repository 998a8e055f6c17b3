"""Raw lab captures → committed fixtures: what the real clients send, with paths and ids replaced consistently.

    .venv/bin/python experiments/agents_lab/scrub.py /work/agents-captures/NAME [--arm direct] \
        [--out tests/fixtures/agents]

Writes OUT/<client>.jsonl (one request a line, in the order sent: labels, method, path, query, headers, body, and
the sim's cached/prompt tokens for that request in the chosen arm) and OUT/MANIFEST.json (client versions, what was
replaced). Replaced, the same value by the same placeholder in every file:

- the scratch paths: repo A → /home/dev/work/inventory, repo B → /home/dev/other/inventory, the client's HOME →
  /home/dev (also in the dash-slug form Claude Code uses for its memory directory);
- UUIDs → 00000000-0000-4000-8000-<12 digits>, long hex ids (device ids, hashes of 32+ digits) → x…<n>;
- loopback ports in URLs and the Host header → 127.0.0.1:8080; API keys are already redacted by the layer.

Dates, versions, tool schemas and the system prompts stay as sent: they are what the fixtures pin.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from run import PACKAGES  # the lab's pinned clients (this directory is on sys.path when run as a script)

WORKS = ("/work/agents-lab-work", "/tmp/agents-lab-work")  # the lab's scratch root, now and in its first runs
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
LONG_HEX = re.compile(r"\b[0-9a-f]{32,}\b")
PORT = re.compile(r"127\.0\.0\.1:\d+")
DROP_HEADERS = {"host", "content-length"}


class Scrubber:
    """Consistent replacements over every string of every record."""

    def __init__(self, client: str) -> None:
        pairs = [
            pair
            for work in WORKS
            for pair in (
                (f"{work}/{client}/repo-a/inventory", "/home/dev/work/inventory"),
                (f"{work}/{client}/repo-b/inventory", "/home/dev/other/inventory"),
                (f"{work}/home/{client}", "/home/dev"),
                (f"{work}/{client}/repo-a", "/home/dev/work"),
                (f"{work}/{client}/repo-b", "/home/dev/other"),
                (work, "/home/dev/lab"),
            )
        ]
        slugs = [(a.replace("/", "-").replace(".", "-"), b.replace("/", "-")) for a, b in pairs]
        self.pairs = sorted(pairs + slugs, key=lambda p: -len(p[0]))
        self.ids: dict[str, str] = {}

    def _uuid(self, m: re.Match[str]) -> str:
        return self.ids.setdefault(m.group(0), f"00000000-0000-4000-8000-{len(self.ids) + 1:012d}")

    def _hex(self, m: re.Match[str]) -> str:
        v = m.group(0)
        return self.ids.setdefault(v, ("x" + str(len(self.ids) + 1)).ljust(len(v), "0"))

    def text(self, s: str) -> str:
        """One string, scrubbed."""
        for old, new in self.pairs:
            if old in s:
                s = s.replace(old, new)
        s = UUID.sub(self._uuid, s)
        s = LONG_HEX.sub(self._hex, s)
        return PORT.sub("127.0.0.1:8080", s)

    def value(self, v: Any) -> Any:
        """Any JSON value, scrubbed (keys too: Codex and Claude Code put ids in keys rarely, paths never)."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {self.text(k): self.value(x) for k, x in v.items()}
        return v


FIELDS = ("seq", "client", "session", "turn", "kind", "api", "method", "path", "query", "status", "headers", "body")


def scrub_capture(path: Path, client: str) -> list[dict[str, Any]]:
    """The records of one raw capture, scrubbed, with the cached/prompt the sim reported."""
    sc = Scrubber(client)
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("path", "").startswith("/_lab/"):
            continue  # the runner's own readiness probe
        keep = {k: rec.get(k) for k in FIELDS}
        keep["headers"] = {k: v for k, v in (rec.get("headers") or {}).items() if k.lower() not in DROP_HEADERS}
        keep["cached_tokens"], keep["prompt_tokens"] = rec.get("cached"), rec.get("prompt")
        out.append(sc.value(keep))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("captures", type=Path)
    p.add_argument("--arm", default="direct", help="which arm's capture (every arm sends the same client bodies)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "tests/fixtures/agents")
    p.add_argument("--clients", default=",".join(PACKAGES))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "MANIFEST.json"
    manifest: dict[str, Any] = {"source": "experiments/agents_lab/run.py", "arm": args.arm, "clients": {}}
    if manifest_path.exists():  # clients not scrubbed this time keep their entries
        manifest["clients"] = json.loads(manifest_path.read_text()).get("clients", {})
    versions = {name: " ".join(pkg.rsplit("@", 1)) for name, pkg in PACKAGES.items()}
    for client in args.clients.split(","):
        src = args.captures / f"{client}-{args.arm}.jsonl"
        if not src.exists():
            print(f"skip {client}: no {src}")
            continue
        recs = scrub_capture(src, client)
        dst = args.out / f"{client}.jsonl"
        dst.write_text("".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in recs))
        manifest["clients"][client] = {"version": versions.get(client, "?"), "requests": len(recs),
                                       "file": dst.name, "bytes": dst.stat().st_size}
        print(f"{dst}: {len(recs)} requests, {dst.stat().st_size:,} bytes")
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
