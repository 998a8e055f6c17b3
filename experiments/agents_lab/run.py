"""The real-client lab: Claude Code, Codex CLI, opencode and Qwen Code, headless, against `kvgate sim` — direct and
through kvgate (normalize off / on) — with real tool calls, every body captured, cached/prompt per request and arm.

Per client and arm, on fresh processes (sim, gateway, scripted layer, client HOME, scratch repos at the same
paths in every arm, commits with fixed dates so the git state is byte-identical):

  main       6 turns in repo A (the first starts the session, the next five continue it)
  same-repo  a new session in repo A
  other-dir  a new session in repo B (the same files at another path)
  git-change a new session in repo A after an untracked file appeared (git status changed)

Each user turn asks the client to run one shell command (`lab-run: cat src/mod_N.py` — files of ~3.6k tokens —
or `ls`); the scripted layer (experiments/agents_lab/layer.py) answers that turn's first request with a tool
call in the client's wire format, the client runs the command and sends its output, the layer answers with text.
The sim's usage (cached_tokens) is what is reported.

Arms: direct (client → layer → sim), off / on (client → layer → kvgate → sim, the tenant's normalize mode).

    .venv/bin/python experiments/agents_lab/run.py install                 # npm clients into ~/.cache/kvgate/agents-npm
    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/agents_lab/run.py run \
        [--clients claude,codex,opencode,qwen] [--arms direct,off,on] [--out /work/agents-captures/NAME]
    .venv/bin/python experiments/agents_lab/run.py report /work/agents-captures/NAME   # tables again

Captures: OUT/<client>-<arm>.jsonl (one line per request: labels, headers (keys redacted), body, status, usage,
x-kvgate-* headers), client logs in OUT/logs/. experiments/agents_lab/scrub.py turns them into fixtures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
from procs import Proc, free_port, wait_http  # noqa: E402

CACHE = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache/kvgate"))
NPM_DIR = CACHE / "agents-npm"
PACKAGES = {
    "claude": "@anthropic-ai/claude-code@2.1.197",
    "codex": "@openai/codex@0.171.0",
    "opencode": "opencode-ai@1.18.33",
    "qwen": "@qwen-code/qwen-code@0.24.4",
}
MODEL = "qwen3-coder"  # a non-Claude name: the self-hosted way (Claude Code then sends a mid-conversation system turn)
API_KEY = "sk-lab-0000000000000000"
WORK = Path("/work/agents-lab-work")  # scratch repos and client homes, the same paths in every arm (not under
# /tmp: Codex refuses to put its helper binaries under a temporary directory)
ARMS = ("direct", "off", "on")
CLIENTS = ("claude", "codex", "opencode", "qwen")
# The same client on another wire: Qwen Code's Anthropic provider (`--auth-type anthropic`, Messages API).
VARIANTS = {"qwen-anthropic": "qwen"}
QWEN_AUTH = {"qwen": "openai", "qwen-anthropic": "anthropic"}  # Qwen Code's auth type (its provider) per lab client

# Loopback only: every client's telemetry, update checks, error reporting and non-essential traffic off.
QUIET_ENV = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
    "CLAUDE_CODE_IDE_SKIP_AUTO_INSTALL": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "DO_NOT_TRACK": "1",
    "CI": "1",
    "NO_PROXY": "127.0.0.1,localhost",
    "HTTP_PROXY": "",
    "HTTPS_PROXY": "",
}


def bin_path(client: str) -> Path:
    """The client's executable in the npm cache."""
    return NPM_DIR / "node_modules" / ".bin" / VARIANTS.get(client, client)


def install() -> int:
    """npm install the pinned clients (native binaries are registry packages: optional dependencies)."""
    NPM_DIR.mkdir(parents=True, exist_ok=True)
    missing = [pkg for name, pkg in PACKAGES.items() if not bin_path(name).exists()]
    if not missing:
        print("clients installed:", ", ".join(PACKAGES.values()))
        return 0
    cmd = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NPM_DIR), *missing]
    print("+", " ".join(cmd))
    return subprocess.call(cmd)


# ---- scratch repos ----------------------------------------------------------------------------------------------


def module_text(n: int, target_tokens: int = 3600) -> str:
    """A plausible Python module of about `target_tokens` sim tokens (≈3.6 characters each), seeded by `n`."""
    lines = [f'"""Module {n}: request helpers for the inventory service."""', "", "from __future__ import annotations",
             "", "import json", "from dataclasses import dataclass", ""]
    i = 0
    while sum(len(s) + 1 for s in lines) < target_tokens * 3.6:
        i += 1
        lines += [
            "@dataclass",
            f"class Record{n}_{i}:",
            f'    """One row of table {n}.{i}: the fields the API returns for it."""',
            "",
            "    name: str",
            f"    quantity: int = {i * n % 97}",
            f"    price_cents: int = {(i * 37 + n) % 1000}",
            "",
            "    def to_json(self) -> str:",
            f'        return json.dumps({{"name": self.name, "quantity": self.quantity, "kind": "r{n}_{i}"}})',
            "",
            f"def total_{n}_{i}(rows: list[Record{n}_{i}]) -> int:",
            f'    """Sum of price times quantity over `rows` (table {n}.{i})."""',
            "    return sum(r.price_cents * r.quantity for r in rows)",
            "",
        ]
    return "\n".join(lines) + "\n"


GIT_ENV = {"GIT_AUTHOR_NAME": "Lab", "GIT_AUTHOR_EMAIL": "lab@example.invalid", "GIT_COMMITTER_NAME": "Lab",
           "GIT_COMMITTER_EMAIL": "lab@example.invalid", "GIT_AUTHOR_DATE": "2026-11-30T12:00:00Z",
           "GIT_COMMITTER_DATE": "2026-11-30T12:00:00Z"}


FIXED_MTIME = datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()  # `ls -la` prints the same bytes in every arm


def make_repo(path: Path, module_tokens: int = 3600) -> None:
    """A small git repo: a README, six modules of ~`module_tokens` tokens, two commits with fixed dates (same hashes
    every arm), the work tree's mtimes fixed too (so a tool's `ls -la` output does not depend on when the arm ran)."""
    if path.exists():
        shutil.rmtree(path)
    (path / "src").mkdir(parents=True)
    env = {**os.environ, **GIT_ENV}
    (path / "README.md").write_text("# inventory\n\nA small inventory service used by the agents lab.\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True, env=env)
    subprocess.run(["git", "add", "."], cwd=path, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "Initial commit"], cwd=path, check=True, env=env)
    for n in range(1, 7):
        (path / "src" / f"mod_{n}.py").write_text(module_text(n, module_tokens))
    subprocess.run(["git", "add", "."], cwd=path, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "Add the inventory modules"], cwd=path, check=True, env=env)
    for p in [*(path / "src").iterdir(), path / "README.md", path / "src", path]:
        os.utime(p, (FIXED_MTIME, FIXED_MTIME))


# ---- clients ----------------------------------------------------------------------------------------------------


def prompt_for(turn: int, command: str) -> str:
    """A user turn: ask for one command (the layer's tool call runs it) and a short answer."""
    return f"Turn {turn}: look at the project with the shell, then answer in one sentence.\nlab-run: {command}"


def client_env(client: str, home: Path, base: str) -> dict[str, str]:
    """Environment of one client invocation: isolated HOME/XDG dirs, loopback base URL, telemetry off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE", "CODEX"))}
    env.update(QUIET_ENV)
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"),
               XDG_CACHE_HOME=str(home / ".cache"), XDG_STATE_HOME=str(home / ".local/state"), TERM="dumb")
    env["PATH"] = f"{NPM_DIR / 'node_modules' / '.bin'}:{env.get('PATH', '')}"
    if client == "claude":
        env.update(ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY=API_KEY, ANTHROPIC_MODEL=MODEL,
                   ANTHROPIC_SMALL_FAST_MODEL=MODEL, ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL,
                   ANTHROPIC_DEFAULT_SONNET_MODEL=MODEL, ANTHROPIC_DEFAULT_OPUS_MODEL=MODEL,
                   CLAUDE_CODE_MAX_OUTPUT_TOKENS="4096", IS_SANDBOX="1")
    elif client == "codex":
        env.update(CODEX_HOME=str(home / ".codex"), LAB_API_KEY=API_KEY)
    elif client == "qwen":  # Qwen Code's OpenAI-compatible provider: chat completions at OPENAI_BASE_URL
        env.update(OPENAI_BASE_URL=f"{base}/v1", OPENAI_API_KEY=API_KEY, OPENAI_MODEL=MODEL)
    elif client == "qwen-anthropic":  # its Anthropic provider: Messages at ANTHROPIC_BASE_URL
        env.update(ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY=API_KEY, ANTHROPIC_MODEL=MODEL)
    return env


def setup_home(client: str, home: Path, base: str) -> None:
    """Fresh client home with the provider configuration pointing at `base`."""
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    if client == "codex":
        (home / ".codex").mkdir()
        (home / ".codex" / "config.toml").write_text(
            f'model = "{MODEL}"\nmodel_provider = "lab"\ncheck_for_update_on_startup = false\n'
            '[model_providers.lab]\nname = "lab"\n'
            f'base_url = "{base}/v1"\nenv_key = "LAB_API_KEY"\nwire_api = "responses"\n'
            "request_max_retries = 0\nstream_max_retries = 0\n"
            "[analytics]\nenabled = false\n[feedback]\nenabled = false\n[otel]\nexporter = \"none\"\n"
        )
    elif client == "opencode":
        cfg_dir = home / ".config" / "opencode"
        cfg_dir.mkdir(parents=True)
        (cfg_dir / "opencode.json").write_text(json.dumps({
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"lab/{MODEL}",
            "small_model": f"lab/{MODEL}",
            "provider": {"lab": {"npm": "@ai-sdk/openai-compatible", "name": "lab",
                                 "options": {"baseURL": f"{base}/v1", "apiKey": API_KEY},
                                 "models": {MODEL: {"name": MODEL, "tool_call": True}}}},
            "permission": {"bash": "allow", "edit": "allow"},
        }, indent=2))
    elif client in QWEN_AUTH:
        (home / ".qwen").mkdir()
        (home / ".qwen" / "settings.json").write_text(json.dumps({
            "security": {"auth": {"selectedType": QWEN_AUTH[client]}},
            "model": {"name": MODEL},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True, "checkpointing": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
        }, indent=2))
    elif client == "claude":
        (home / ".claude").mkdir()
        (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted":
                                                       True}))


def client_argv(client: str, prompt: str, *, resume: bool, extra: list[str] | None = None) -> list[str]:
    """The headless command line of one turn (`extra`: more flags for the client, e.g. Claude Code's
    `--exclude-dynamic-system-prompt-sections`)."""
    exe = str(bin_path(client))
    extra = extra or []
    if client == "claude":
        return [exe, "-p", prompt, "--output-format", "json", "--model", MODEL, "--allowedTools", "Bash", *extra,
                *(["--continue"] if resume else [])]
    if client == "codex":
        flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        flags += extra
        return [exe, "exec", "resume", "--last", *flags, prompt] if resume else [exe, "exec", *flags, prompt]
    if client in QWEN_AUTH:
        return [exe, "--yolo", "--output-format", "json", "-m", MODEL, "--auth-type", QWEN_AUTH[client], *extra,
                *(["--continue"] if resume else []), prompt]
    return [exe, "run", *extra, *(["--continue"] if resume else []), prompt]


# ---- processes --------------------------------------------------------------------------------------------------

PY = sys.executable
KVGATE = [PY, "-c", "import sys; from app.cli import main; sys.exit(main())"]


def start_sim(log_dir: Path, name: str, time_scale: float, extra: list[str] | None = None) -> Proc:
    """A fresh `kvgate sim` replica serving MODEL (h100-8b profile, 16-token blocks, long context)."""
    port = free_port()
    argv = [*KVGATE, "sim", "--port", str(port), "--model", MODEL, "--time-scale", str(time_scale),
            "--max-model-len", "131072", "--mean-output-tokens", "8", "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", "--log-level", "warning", *(extra or [])]
    return Proc(name, f"http://127.0.0.1:{port}", argv, log=log_dir / f"{name}.log").start()


def gateway_cfg(replicas: list[str], normalize: str, policy: str = "prefix_affinity",
                routing: dict[str, Any] | None = None) -> dict[str, Any]:
    """One public model MODEL, one pool over `replicas`, one tenant with the arm's normalize mode."""
    return {
        "models": [{"name": MODEL, "pools": ["main"]}],
        "pools": {"main": {"role": "interactive", "served_model": MODEL, "replicas": replicas, "policy": policy,
                           "price": {"gpu_hour_usd": 2.5, "gpus": 1, "capacity_tokens_per_s": 5000}}},
        "tenants": [{"id": "lab", "api_keys": [API_KEY], "default_class": "interactive", "normalize": normalize}],
        "auth": {"required": True},
        "routing": routing or {},
        "upstream": {"read_timeout_s": 300},
    }


def start_gateway(log_dir: Path, name: str, cfg: dict[str, Any], checkout: Path = ROOT) -> Proc:
    """`kvgate serve` on `cfg` (from `checkout`, so an older tree can run beside this one)."""
    port = free_port()
    path = log_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = [PY, "-c", "import sys; from app.cli import main; sys.exit(main())", "serve", "--config", str(path),
            "--port", str(port), "--log-level", "info"]
    proc = Proc(name, f"http://127.0.0.1:{port}", argv, log=log_dir / f"{name}.log")
    if checkout != ROOT:
        proc.env = {**os.environ, "PYTHONPATH": str(checkout)}
        out = open(proc.log, "ab")  # noqa: SIM115 - lives with the child
        proc.popen = subprocess.Popen(argv, cwd=checkout, stdout=out, stderr=subprocess.STDOUT, env=proc.env)
        wait_http(proc.url + "/ready", 60, proc.popen)
        return proc
    return proc.start("/ready", 60)


def start_layer(log_dir: Path, name: str, upstream: str, capture: Path, *, passthrough: bool = False) -> Proc:
    """The scripted layer in front of `upstream`, capturing into `capture` (a plain tap with `passthrough`)."""
    port = free_port()
    argv = [PY, str(HERE / "layer.py"), "--port", str(port), "--upstream", upstream, "--capture", str(capture),
            *(["--passthrough"] if passthrough else [])]
    return Proc(name, f"http://127.0.0.1:{port}", argv, log=log_dir / f"{name}.log").start("/_lab/ping", 30,
                                                                                          any_status=True)


def label(layer: Proc, **labels: Any) -> None:
    """Labels for the next captured requests."""
    httpx.post(layer.url + "/_lab/label", json=labels, timeout=5).raise_for_status()


# ---- one arm ----------------------------------------------------------------------------------------------------

SESSIONS: list[tuple[str, str, int]] = [("main", "A", 6), ("same-repo", "A", 1), ("other-dir", "B", 1),
                                        ("git-change", "A", 1)]
COMMANDS = ["cat src/mod_1.py", "ls -la src", "cat src/mod_2.py", "cat src/mod_3.py", "git log --oneline",
            "cat src/mod_4.py"]


def run_turn(client: str, argv: list[str], cwd: Path, env: dict[str, str], log: Path,
             timeout_s: float) -> tuple[int, float]:
    """One client invocation; (rc, seconds). Its stdout/stderr go to `log`."""
    t0 = time.monotonic()
    env = {**env, "PWD": str(cwd)}  # opencode takes its directory from $PWD, not the process's cwd
    with log.open("ab") as f:
        f.write(f"\n$ {' '.join(argv)}  (cwd {cwd})\n".encode())
        f.flush()
        try:
            rc = subprocess.run(argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = -9
    return rc, time.monotonic() - t0


def run_arm(client: str, arm: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Fresh sim (+ gateway) + layer + client home + repos; the four sessions; returns the turn results."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    capture = out / f"{client}-{arm}.jsonl"
    capture.unlink(missing_ok=True)
    procs: list[Proc] = []
    turns: list[dict[str, Any]] = []
    try:
        sim = start_sim(logs, f"{client}-{arm}-sim", args.time_scale)
        procs.append(sim)
        upstream = sim.url
        if arm != "direct":
            gw = start_gateway(logs, f"{client}-{arm}-gateway", gateway_cfg([sim.url], arm), args.checkout)
            procs.append(gw)
            upstream = gw.url
        layer = start_layer(logs, f"{client}-{arm}-layer", upstream, capture)
        procs.append(layer)
        home = WORK / "home" / client
        setup_home(client, home, layer.url)
        repo_a, repo_b = WORK / client / "repo-a" / "inventory", WORK / client / "repo-b" / "inventory"
        make_repo(repo_a, args.module_tokens)
        make_repo(repo_b, args.module_tokens)
        env = client_env(client, home, layer.url)
        clog = logs / f"{client}-{arm}-client.log"
        clog.unlink(missing_ok=True)
        for session, where, n_turns in SESSIONS:
            cwd = repo_a if where == "A" else repo_b
            if session == "git-change":
                (repo_a / "NOTES.md").write_text("todo: check the totals\n")
                for p in (repo_a / "NOTES.md", repo_a):
                    os.utime(p, (FIXED_MTIME, FIXED_MTIME))
            for t in range(1, n_turns + 1):
                command = COMMANDS[(t - 1) % len(COMMANDS)] if session == "main" else "cat src/mod_5.py"
                label(layer, arm=arm, client=client, session=session, turn=t)
                argv = client_argv(client, prompt_for(t, command), resume=t > 1,
                                   extra=args.client_args.split() if args.client_args else None)
                rc, secs = run_turn(client, argv, cwd, env, clog, args.turn_timeout_s)
                turns.append({"session": session, "turn": t, "rc": rc, "seconds": round(secs, 2)})
                print(f"[{datetime.now(UTC):%H:%M:%S}] {client} {arm} {session} turn {t}: rc={rc} {secs:.1f}s",
                      file=sys.stderr)
    finally:
        for p in reversed(procs):
            p.stop()
    return {"client": client, "arm": arm, "turns": turns}


# ---- report -----------------------------------------------------------------------------------------------------


def load_capture(path: Path) -> list[dict[str, Any]]:
    """The capture's records (empty when missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ratio(cached: int, prompt: int) -> str:
    """cached/prompt as a percentage."""
    return f"{100 * cached / prompt:.1f}%" if prompt else "-"


def report(out: Path, clients: list[str], arms: list[str]) -> str:
    """Markdown tables: per client and arm, overall and per request kind, then the first request of each session."""
    lines = ["| client | arm | requests | non-200 | prompt tokens | cached tokens | cached/prompt | turn-open | "
             "tool-result | other |", "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    firsts = ["", "First generation request of each session (cached/prompt):", "",
              "| client | arm | main | same-repo | other-dir | git-change |", "|---|---|--:|--:|--:|--:|"]
    for client in clients:
        for arm in arms:
            recs = [r for r in load_capture(out / f"{client}-{arm}.jsonl") if r.get("method") == "POST"
                    and (r.get("api") or r.get("status") != 200) and not r["path"].endswith("count_tokens")]
            if not recs:
                continue
            gen = [r for r in recs if r.get("prompt")]
            bad = sum(1 for r in recs if r.get("status") != 200)
            c, p = sum(r["cached"] for r in gen), sum(r["prompt"] for r in gen)
            kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for r in gen:
                kinds[r["kind"]][0] += r["cached"]
                kinds[r["kind"]][1] += r["prompt"]
            lines.append(f"| {client} | {arm} | {len(recs)} | {bad} | {p:,} | {c:,} | {ratio(c, p)} | "
                         + " | ".join(ratio(*kinds[k]) for k in ("turn-open", "tool-result", "other")) + " |")
            cells = []
            for s in ("main", "same-repo", "other-dir", "git-change"):
                first = next((r for r in gen if r.get("session") == s and r.get("kind") == "turn-open"), None)
                cells.append(ratio(first["cached"], first["prompt"]) + f" of {first['prompt']:,}" if first else "-")
            firsts.append(f"| {client} | {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines + firsts)


def per_request(out: Path, client: str, arms: list[str]) -> str:
    """One row per generation request of `client`: its uncached prompt tokens (prompt - cached) in every arm, so
    where each arm pays prefill can be read off (arms line up by order: every arm runs the same script)."""
    by_arm = {arm: [r for r in load_capture(out / f"{client}-{arm}.jsonl") if r.get("prompt")] for arm in arms}
    by_arm = {a: rs for a, rs in by_arm.items() if rs}
    lines = ["| # | session | turn | kind | prompt | " + " | ".join(f"uncached {a}" for a in by_arm) + " |",
             "|--:|---|--:|---|--:|" + "--:|" * len(by_arm)]
    rows = zip(*by_arm.values(), strict=False)
    for i, recs in enumerate(rows, 1):
        r0 = recs[0]
        lines.append(f"| {i} | {r0.get('session')} | {r0.get('turn')} | {r0.get('kind')} | {r0['prompt']:,} | "
                     + " | ".join(f"{r['prompt'] - r['cached']:,}" for r in recs) + " |")
    totals = [sum(r["prompt"] - r["cached"] for r in rs) for rs in by_arm.values()]
    lines.append("| | all | | | | " + " | ".join(f"**{t:,}**" for t in totals) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install")
    r = sub.add_parser("run")
    r.add_argument("--clients", default=",".join(CLIENTS))
    r.add_argument("--arms", default=",".join(ARMS))
    r.add_argument("--out", type=Path, default=Path("/work/agents-captures") / datetime.now(UTC).strftime(
        "%Y%m%d-%H%M"))
    r.add_argument("--time-scale", type=float, default=20.0, help="sim clock speed-up")
    r.add_argument("--turn-timeout-s", type=float, default=180.0)
    r.add_argument("--module-tokens", type=int, default=3600,
                   help="size of each scratch module, so of each `cat` tool output (the issue's 3-4k by default)")
    r.add_argument("--client-args", default="",
                   help="more flags for every client invocation (e.g. --exclude-dynamic-system-prompt-sections)")
    r.add_argument("--checkout", type=Path, default=ROOT,
                   help="run the gateway from this checkout (e.g. another branch's worktree)")
    rep = sub.add_parser("report")
    rep.add_argument("out", type=Path)
    rep.add_argument("--clients", default=",".join(CLIENTS))
    rep.add_argument("--arms", default=",".join(ARMS))
    rep.add_argument("--per-request", action="store_true", help="also each request's uncached tokens per arm")
    args = p.parse_args()
    if args.cmd == "install":
        return install()
    clients, arms = args.clients.split(","), args.arms.split(",")
    if args.cmd == "report":
        print(report(args.out, clients, arms))
        if args.per_request:
            for client in clients:
                print(f"\n{client}, uncached prompt tokens per request:\n")
                print(per_request(args.out, client, arms))
        return 0
    if install() != 0:
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for client in clients:
        for arm in arms:
            results.append(run_arm(client, arm, args.out, args))
    (args.out / "turns.json").write_text(json.dumps(results, indent=1))
    text = report(args.out, clients, arms)
    (args.out / "report.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
