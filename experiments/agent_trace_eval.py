"""Issue 11: agent traces through the gateway's /v1/messages and /v1/responses, normalize off vs on vs ceiling.

Two seeded traces, N sessions x T turns each, sent with the official SDKs through a `kvgate serve` the
script starts (in-memory store, one pool over the upstreams, `prefix_affinity`):

  claude     Claude-Code-shaped Messages: `system` in text blocks — the billing line
             `x-anthropic-billing-header: cc_version=…; cc_entrypoint=cli; cch=<5 hex>;` first (a fresh nonce
             per request), an identity block, ~4 KB of static instructions, an environment block (cwd, today's
             date, session id); 12 tools with JSON schemas in Anthropic's `tools` format. Every turn appends
             the assistant's text + tool_use, a user message with the tool_result and a new instruction.
  codex      Codex-shaped Responses: ~3 KB `instructions`, first input item a user `<environment_context>`
             (cwd, approval/sandbox/network, shell, the current date-time and a request id, both new on every
             request) as `Label: value` lines; 8 tools in Responses' flat function format. Every turn appends
             an assistant message, a function_call (shell) + function_call_output and a new user message.
  codex-xml  the same, with the environment as Codex itself writes it: one `<tag>value</tag>` per line.

Arms, each as its own tenant (own API key, own cache_salt, cold volatility memory; tenant ids carry a per-run
tag, so no arm meets another arm's or an earlier run's blocks):

  off       the trace as sent, tenant normalize: off
  on        the same requests, tenant normalize: on
  ceiling   the same trace with the volatile lines removed (no billing block, no date / session / request id
            lines), tenant normalize: off — what a cache-friendly client would send

The assistant turns are scripted (not the model's replies), so every arm sends the same conversation; requests
go in one fixed order (a closed loop of --concurrency slots, round robin over the open sessions, a turn after
its session's previous reply). Cached tokens come from each API's usage: Messages `cache_read_input_tokens`
(the prompt being input + cache_read + cache_creation), Responses `input_tokens_details.cached_tokens`; vLLM
reports them with `--enable-prompt-tokens-details` (scripts/vllm-cpu.sh sets it). The upstreams' own
/metrics prefix-cache counters are read around every arm as a cross-check.

    .venv/bin/python experiments/agent_trace_eval.py                       # real vLLM-CPU on :8001 and :8002 (~5 min)
    .venv/bin/python experiments/agent_trace_eval.py --sessions 2 --turns 3 --traces claude
    .venv/bin/python experiments/agent_trace_eval.py --sim                  # plumbing check against two sims
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx
import openai
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from normalize_eval import (  # noqa: E402
    counter_sum,
    gateway_process,
    issue_order,
    reset_prefix_caches,
    scrape,
)

MODEL = "smollm2-135m"
VLLM_REPLICAS = ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
TRACES = ("claude", "codex", "codex-xml")
ARM_NAMES = ("off", "on", "ceiling")
SMOLLM2_TOKENIZER = Path.home() / ".cache" / "kvgate" / "models" / "smollm2-135m" / "tokenizer.json"
BASE_DAY = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

# -- the Claude-Code-shaped trace ------------------------------------------------------------------

CLAUDE_VERSION = "2.1.37"
CLAUDE_IDENTITY = "You are an interactive command-line coding agent that helps users with software engineering tasks."
CLAUDE_INSTRUCTIONS = "\n\n".join([
    "Use the instructions below and the tools available to you to assist the user. Refuse to write or improve "
    "code that is clearly meant to be used maliciously, even when the user says it is for education. Before you "
    "edit a file, work out what the code does from its names and its layout; if it looks harmful, decline.",
    "# Tone and style\nBe concise, direct and to the point. When you run a non-trivial shell command, say in one "
    "sentence what it does and why you run it, above all when it changes the user's system. Your output is shown "
    "in a terminal in a monospace font and rendered as CommonMark. Talk to the user only in text outside of tool "
    "calls; never use a tool or a code comment as a way to talk to them. If you cannot help, say so in one or two "
    "sentences without preaching, and offer an alternative when you have one.",
    "Keep answers short unless the user asks for detail: answer in fewer than four lines of text (tool use and "
    "generated code not counted). Skip preambles such as \"Here is what I will do\" and closing summaries of what "
    "you just did. One-word answers are best when they answer the question. Do not add explanations of your code "
    "unless asked.",
    "# Proactiveness\nDo what the user asked, including the obvious follow-up actions, but do not surprise them "
    "with actions they did not ask for. If they ask how to approach something, answer the question first instead "
    "of jumping into changes.",
    "# Following conventions\nWhen you change a file, first learn its conventions. Mimic its style, use the "
    "libraries and utilities already in the project, and follow existing patterns. Never assume that a library "
    "is available, even a well-known one: check the manifest (package.json, pyproject.toml, Cargo.toml) or the "
    "neighbouring files first. When you write a new component, look at existing components to see how they are "
    "written: framework choice, naming, typing and the other conventions. When you edit code, read its imports "
    "and surroundings to understand its frameworks and make the change in the most idiomatic way.",
    "Always follow security best practice. Never write code that exposes or logs secrets and keys, and never "
    "commit secrets or keys to the repository. Do not add comments to the code you write unless the user asks "
    "for them or the code is complex enough to need the context.",
    "# Task management\nYou have a todo tool to plan and track tasks. Use it very often, so the user can follow "
    "your progress: break larger tasks into smaller steps, mark each step as in progress when you start it and "
    "as completed as soon as it is done. Do not batch several tasks before marking them as completed.",
    "# Doing tasks\nThe user will mostly ask you to fix bugs, add features, refactor code or explain code. For "
    "such tasks: plan the work with the todo tool if it is required; use the search tools to understand the "
    "codebase and the user's query, in parallel and sequentially; implement the solution with the tools "
    "available; verify it with the project's tests (never assume a particular test framework or test script: "
    "read the README or search the codebase to find the testing approach); when you have completed a task, run "
    "the lint and type-check commands the project uses so that your code is correct. Never commit changes "
    "unless the user explicitly asks you to.",
    "# Tool usage policy\nWhen doing a file search, prefer the Task tool to save context. When several pieces of "
    "information are independent, batch the tool calls in one message so they run in parallel. When you run "
    "several shell commands, send one message with several tool calls rather than one call per message. Prefer "
    "the dedicated tools over shell commands for reading, searching and editing files: Read instead of cat, "
    "Grep instead of grep, Glob instead of find, Edit instead of sed.",
    "# Code references\nWhen you refer to a specific function or piece of code, use the pattern "
    "`file_path:line_number` so the user can jump straight to the source location.",
])
CLAUDE_ENV = (
    "Here is useful information about the environment you are running in:\n<env>\nWorking directory: {cwd}\n"
    "Is directory a git repo: Yes\nPlatform: linux\nOS Version: Linux 6.8.0-49-generic\n"
    "Today's date: {day}\nSession ID: {session_id}\n</env>"
)
CLAUDE_ENV_STATIC = (
    "Here is useful information about the environment you are running in:\n<env>\nWorking directory: {cwd}\n"
    "Is directory a git repo: Yes\nPlatform: linux\nOS Version: Linux 6.8.0-49-generic\n</env>"
)


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#"}


_STR = {"type": "string"}
CLAUDE_TOOLS: list[dict[str, Any]] = [
    {"name": "Task", "description": "Launch a sub-agent to handle a complex, multi-step search or task on its own.",
     "input_schema": _schema({"description": {**_STR, "description": "A short (3-5 word) description of the task"},
                              "prompt": {**_STR, "description": "The task for the agent to perform"},
                              "subagent_type": {**_STR, "description": "The type of agent to use"}},
                             ["description", "prompt", "subagent_type"])},
    {"name": "Bash", "description": "Execute a bash command in a persistent shell session with an optional timeout.",
     "input_schema": _schema({"command": {**_STR, "description": "The command to execute"},
                              "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
                              "description": {**_STR, "description": "What this command does, in 5-10 words"}},
                             ["command"])},
    {"name": "Glob", "description": "Fast file pattern matching; returns matching paths sorted by modification time.",
     "input_schema": _schema({"pattern": {**_STR, "description": "The glob pattern to match files against"},
                              "path": {**_STR, "description": "The directory to search in"}}, ["pattern"])},
    {"name": "Grep", "description": "Search file contents with a regular expression (ripgrep syntax).",
     "input_schema": _schema({"pattern": {**_STR, "description": "The regular expression to search for"},
                              "path": {**_STR, "description": "File or directory to search in"},
                              "glob": {**_STR, "description": "Glob pattern to filter files"},
                              "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
                              "-n": {"type": "boolean", "description": "Show line numbers"}}, ["pattern"])},
    {"name": "LS", "description": "List files and directories in a given absolute path.",
     "input_schema": _schema({"path": {**_STR, "description": "The absolute path of the directory to list"},
                              "ignore": {"type": "array", "items": _STR, "description": "Glob patterns to ignore"}},
                             ["path"])},
    {"name": "Read", "description": "Read a file from the local filesystem, with line numbers.",
     "input_schema": _schema({"file_path": {**_STR, "description": "The absolute path to the file to read"},
                              "offset": {"type": "number", "description": "The line number to start reading from"},
                              "limit": {"type": "number", "description": "The number of lines to read"}},
                             ["file_path"])},
    {"name": "Edit", "description": "Perform an exact string replacement in a file.",
     "input_schema": _schema({"file_path": {**_STR, "description": "The absolute path to the file to modify"},
                              "old_string": {**_STR, "description": "The text to replace"},
                              "new_string": {**_STR, "description": "The text to replace it with"},
                              "replace_all": {"type": "boolean", "default": False}},
                             ["file_path", "old_string", "new_string"])},
    {"name": "MultiEdit", "description": "Make several edits to one file in one operation.",
     "input_schema": _schema({"file_path": _STR, "edits": {"type": "array", "items": _schema(
         {"old_string": _STR, "new_string": _STR, "replace_all": {"type": "boolean"}}, ["old_string", "new_string"])}},
         ["file_path", "edits"])},
    {"name": "Write", "description": "Write a file to the local filesystem, overwriting it if it exists.",
     "input_schema": _schema({"file_path": {**_STR, "description": "The absolute path to the file to write"},
                              "content": {**_STR, "description": "The content to write to the file"}},
                             ["file_path", "content"])},
    {"name": "NotebookEdit", "description": "Replace the contents of a specific cell in a Jupyter notebook.",
     "input_schema": _schema({"notebook_path": _STR, "cell_id": _STR, "new_source": _STR,
                              "cell_type": {"type": "string", "enum": ["code", "markdown"]},
                              "edit_mode": {"type": "string", "enum": ["replace", "insert", "delete"]}},
                             ["notebook_path", "new_source"])},
    {"name": "WebFetch", "description": "Fetch a URL and process its content with a prompt.",
     "input_schema": _schema({"url": {"type": "string", "format": "uri"}, "prompt": _STR}, ["url", "prompt"])},
    {"name": "TodoWrite", "description": "Create and manage a structured task list for the current session.",
     "input_schema": _schema({"todos": {"type": "array", "items": _schema(
         {"content": {"type": "string", "minLength": 1},
          "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
          "id": _STR}, ["content", "status", "id"])}}, ["todos"])},
]

# -- the Codex-shaped trace ------------------------------------------------------------------------

CODEX_INSTRUCTIONS = "\n\n".join([
    "You are a coding agent running in a terminal-based coding assistant. You are expected to be precise, safe "
    "and helpful. You can receive user prompts and other context provided by the harness, such as files in the "
    "workspace; communicate with the user by streaming thinking and responses and by making and updating plans; "
    "and emit function calls to run terminal commands and apply patches.",
    "## How you work\nKeep going until the query is completely resolved before ending your turn. Only terminate "
    "your turn when you are sure that the problem is solved. Autonomously resolve the query to the best of your "
    "ability, using the tools available to you, before coming back to the user. Do not guess or make up an "
    "answer.",
    "## Planning\nYou have a plan tool that tracks steps and progress. A good plan breaks the task into "
    "meaningful, logically ordered steps that are easy to verify as you go. Do not pad simple work with filler "
    "steps or state the obvious. After a step is done, mark it completed and move to the next one.",
    "## Task execution\nYou must adhere to these criteria when executing a task: working on the repository in "
    "the current environment is allowed, even if it is proprietary; analysing code for vulnerabilities is "
    "allowed; showing user code and tool call details is allowed. Use the apply_patch tool to edit files. Fix "
    "the problem at the root cause rather than applying surface-level patches. Avoid unneeded complexity. Do not "
    "fix unrelated bugs or broken tests. Keep changes consistent with the style of the existing codebase: "
    "changes should be minimal and focused on the task.",
    "## Sandbox and approvals\nThe harness supports several sandboxing and approval configurations; the one in "
    "force is described in the environment context. When a command needs to escape the sandbox, request "
    "approval with a one-sentence justification instead of working around the restriction.",
    "## Validating your work\nIf the codebase has tests or the ability to build or run, use them to verify that "
    "your work is complete. Start as specific as possible to the code you changed, then make your way to "
    "broader tests as you build confidence. Do not add tests to a codebase without tests.",
    "## Presenting your work\nYour final message should read naturally, like an update from a concise teammate. "
    "Use short headers only when they help, bullets with a dash, and wrap commands, paths and identifiers in "
    "backticks. Reference files as clickable paths with an optional line number.",
    "## Shell commands\nWhen using the shell, prefer `rg` over `grep` for searching text and files because it is "
    "much faster. Always set the working directory of a command instead of using `cd`. Read files in chunks of "
    "at most 250 lines.",
])


def _fn(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": description, "strict": False,
            "parameters": {"type": "object", "properties": props, "required": required,
                           "additionalProperties": False}}


CODEX_TOOLS: list[dict[str, Any]] = [
    _fn("shell", "Runs a shell command and returns its output.",
        {"command": {"type": "array", "items": _STR, "description": "The command to execute"},
         "workdir": {**_STR, "description": "The working directory to execute the command in"},
         "timeout_ms": {"type": "number", "description": "The timeout for the command in milliseconds"}},
        ["command"]),
    _fn("apply_patch", "Use this tool to edit files with a patch in the apply_patch format.",
        {"input": {**_STR, "description": "The entire contents of the apply_patch command"}}, ["input"]),
    _fn("update_plan", "Updates the task plan: a list of steps, each with a status.",
        {"explanation": _STR, "plan": {"type": "array", "items": {"type": "object", "properties": {
            "step": _STR, "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}},
            "required": ["step", "status"], "additionalProperties": False}}}, ["plan"]),
    _fn("view_image", "Attach a local image (by filesystem path) to the conversation context.",
        {"path": {**_STR, "description": "Local filesystem path to an image file"}}, ["path"]),
    _fn("read_file", "Reads a local file with 1-indexed line numbers.",
        {"file_path": _STR, "offset": {"type": "number"}, "limit": {"type": "number"}}, ["file_path"]),
    _fn("list_dir", "Lists entries in a local directory with simple type labels.",
        {"dir_path": _STR, "depth": {"type": "number"}}, ["dir_path"]),
    _fn("grep_files", "Finds files whose contents match a pattern, sorted by modification time.",
        {"pattern": _STR, "include": _STR, "path": _STR, "limit": {"type": "number"}}, ["pattern"]),
    _fn("web_search", "Searches the web and returns result snippets.", {"query": _STR}, ["query"]),
]
CODEX_ENV_LINES = (
    "<environment_context>\n  Current working directory: {cwd}\n  Approval policy: on-request\n"
    "  Sandbox mode: workspace-write\n  Network access: restricted\n  Shell: bash\n"
    "  Current date: {now}\n  Request ID: {request_id}\n</environment_context>"
)
CODEX_ENV_XML = (
    "<environment_context>\n  <cwd>{cwd}</cwd>\n  <approval_policy>on-request</approval_policy>\n"
    "  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>restricted</network_access>\n"
    "  <shell>bash</shell>\n  <current_date>{now}</current_date>\n  <request_id>{request_id}</request_id>\n"
    "</environment_context>"
)
_VOLATILE_ENV_MARKERS = ("Current date:", "Request ID:", "<current_date>", "<request_id>")

# -- conversation material (shared by both traces) -------------------------------------------------

PROJECTS = ("billing-api", "web-frontend", "ingest-worker", "auth-service", "search-indexer", "cli-tools",
            "payments-gateway", "report-builder")
MODULES = ("config", "handlers", "models", "storage", "retry", "schema", "client", "cache", "metrics", "queue")
TASKS = (
    "The nightly job fails with a timeout when the upstream is slow. Find where the timeout is set and make it "
    "configurable, with the current value as the default.",
    "Add input validation to the create endpoint: reject empty names and negative quantities with a clear error.",
    "The cache is never invalidated after an update. Find the write path and invalidate the entry after the write.",
    "Rename the legacy helper to something that says what it does and update every caller.",
    "Our retry loop retries on every error, including bad requests. Make it retry only on timeouts and 5xx.",
    "Write a test for the parser that covers the empty input and the trailing comma cases.",
)
FOLLOW_UPS = (
    "Good. Now run the tests for that module.", "Can you also check the other callers?",
    "That looks right. Update the docstring too.", "Run the linter on the files you touched.",
    "Show me the diff so far.", "Now handle the error path the same way.", "Please add a changelog entry.",
    "Keep going with the next step of the plan.",
)
ASSISTANT = (
    "I'll look at how {m} is wired first.", "Let me search for the callers of the {m} helpers.",
    "Checking the current tests for {m} before changing anything.", "I'll read the {m} module to see the flow.",
    "Now I'll make the change in {m}.", "Running the tests that cover {m}.",
)


def _tool_result(rng: random.Random, module: str) -> str:
    """A few numbered source lines, as a read/grep/test tool would return them (~250-350 characters)."""
    start = rng.randint(10, 200)
    names = rng.sample(("load", "parse", "apply", "fetch", "store", "close", "retry", "flush"), 4)
    lines = [f"{start + i:>5}\tdef {n}_{module}(self, value, *, timeout=None):" if i % 2 == 0
             else f"{start + i:>5}\t    return self._{n}(value, timeout or self.default_timeout)"
             for i, n in enumerate(names)]
    return "\n".join(lines) + f"\n[{rng.randint(2, 9)} more lines]"


@dataclass(frozen=True)
class Exchange:
    """One scripted agent step: the assistant's text and tool call, the tool's output, the next user message."""

    text: str
    tool: str
    tool_input: dict[str, Any]
    output: str
    user: str
    call_id: str


@dataclass(frozen=True)
class AgentSession:
    """One seeded session: its static context, its scripted steps, and the volatile values of every request."""

    index: int
    cwd: str
    task: str
    exchanges: tuple[Exchange, ...]
    session_id: str
    day: str
    nonces: tuple[str, ...]  # one per request (Claude's cch)
    times: tuple[str, ...]  # one per request (Codex's current date-time)
    request_ids: tuple[str, ...]  # one per request (Codex)

    @property
    def turns(self) -> int:
        """Requests in this session."""
        return len(self.exchanges) + 1


def make_sessions(trace: str, sessions: int, turns: int, seed: int) -> list[AgentSession]:
    """The trace's sessions (the same in every arm: seeded by trace family and session index)."""
    family = "codex" if trace.startswith("codex") else "claude"
    out = []
    for i in range(sessions):
        rng = random.Random(f"{seed}/{family}/{i}")
        project = PROJECTS[(i + seed) % len(PROJECTS)]
        cwd = f"/home/dev/src/{project}"
        steps = []
        for k in range(turns - 1):
            module = rng.choice(MODULES)
            path = f"{cwd}/src/{module}.py"
            args: dict[str, Any]
            if family == "claude":
                tool, args = rng.choice((
                    ("Read", {"file_path": path}), ("Grep", {"pattern": f"def .*_{module}", "path": f"{cwd}/src"}),
                    ("Bash", {"command": f"pytest -q tests/test_{module}.py", "description": "Run the tests"}),
                    ("Glob", {"pattern": f"**/*{module}*.py"}),
                ))
                call_id = f"toolu_{rng.getrandbits(96):024x}"
            else:
                command = rng.choice((f"sed -n '1,80p' src/{module}.py", f"rg -n '_{module}' src",
                                      f"pytest -q tests/test_{module}.py"))
                tool, args = "shell", {"command": ["bash", "-lc", command], "workdir": cwd}
                call_id = f"call_{rng.getrandbits(96):024x}"
            steps.append(Exchange(text=rng.choice(ASSISTANT).format(m=module), tool=tool, tool_input=args,
                                  output=_tool_result(rng, module), user=FOLLOW_UPS[(i + k) % len(FOLLOW_UPS)],
                                  call_id=call_id))
        start = BASE_DAY + timedelta(days=i // 2, minutes=37 * i)
        offsets = [0]
        for _ in range(turns - 1):
            offsets.append(offsets[-1] + rng.randint(20, 90))
        out.append(AgentSession(
            index=i, cwd=cwd, task=TASKS[(i + seed) % len(TASKS)], exchanges=tuple(steps),
            session_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)), day=f"{start:%Y-%m-%d}",
            nonces=tuple(f"{rng.getrandbits(20):05x}" for _ in range(turns)),
            times=tuple(f"{start + timedelta(seconds=s):%Y-%m-%dT%H:%M:%SZ}" for s in offsets),
            request_ids=tuple(f"req_{rng.getrandbits(64):016x}" for _ in range(turns)),
        ))
    return out


def claude_request(s: AgentSession, turn: int, *, static: bool) -> dict[str, Any]:
    """`messages.create` keywords (bar model and max_tokens) of request `turn` of a Claude-Code-shaped session."""
    system = [] if static else [{"type": "text", "text": f"x-anthropic-billing-header: cc_version={CLAUDE_VERSION}; "
                                                        f"cc_entrypoint=cli; cch={s.nonces[turn]};"}]
    env = (CLAUDE_ENV_STATIC if static else CLAUDE_ENV).format(cwd=s.cwd, day=s.day, session_id=s.session_id)
    system += [{"type": "text", "text": CLAUDE_IDENTITY}, {"type": "text", "text": CLAUDE_INSTRUCTIONS},
               {"type": "text", "text": env}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": s.task}]}]
    for x in s.exchanges[:turn]:
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": x.text},
            {"type": "tool_use", "id": x.call_id, "name": x.tool, "input": x.tool_input}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": x.call_id, "content": x.output},
            {"type": "text", "text": x.user}]})
    return {"system": system, "messages": messages, "tools": CLAUDE_TOOLS}


def codex_request(s: AgentSession, turn: int, *, static: bool, xml: bool) -> dict[str, Any]:
    """`responses.create` keywords (bar model and max_output_tokens) of request `turn` of a Codex-shaped session."""
    env = (CODEX_ENV_XML if xml else CODEX_ENV_LINES).format(cwd=s.cwd, now=s.times[turn],
                                                             request_id=s.request_ids[turn])
    if static:
        env = "\n".join(ln for ln in env.split("\n") if not ln.strip().startswith(_VOLATILE_ENV_MARKERS))
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": env}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": s.task}]},
    ]
    for x in s.exchanges[:turn]:
        items += [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": x.text}]},
            {"type": "function_call", "call_id": x.call_id, "name": x.tool, "arguments": json.dumps(x.tool_input)},
            {"type": "function_call_output", "call_id": x.call_id, "output": x.output},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": x.user}]},
        ]
    return {"instructions": CODEX_INSTRUCTIONS, "input": items, "tools": CODEX_TOOLS, "store": False}


def build_request(trace: str, s: AgentSession, turn: int, *, static: bool) -> dict[str, Any]:
    """The request keywords of one turn of `trace`."""
    if trace == "claude":
        return claude_request(s, turn, static=static)
    return codex_request(s, turn, static=static, xml=trace == "codex-xml")


# -- arms, requests, records -----------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One trace under one arm, as its own tenant."""

    trace: str
    name: str
    run: str  # a per-run tag: a new tenant (so a new cache_salt) on every run

    @property
    def tenant(self) -> str:
        """The gateway tenant of this arm."""
        return f"at-{self.run}-{self.trace}-{self.name}"

    @property
    def api_key(self) -> str:
        """The tenant's key."""
        return "sk-" + self.tenant

    @property
    def normalize(self) -> str:
        """The tenant's normalize mode."""
        return "on" if self.name == "on" else "off"

    @property
    def static(self) -> bool:
        """Whether the arm sends the trace without its volatile lines."""
        return self.name == "ceiling"


@dataclass
class Record:
    """What one request measured."""

    session: int
    turn: int
    ok: bool = False
    error: str = ""
    prompt: int = 0
    cached: int = 0
    header: str = ""
    latency_s: float = 0.0


@dataclass
class ArmResult:
    """One arm's records and the upstream counters around it."""

    arm: Arm
    records: list[Record]
    wall_s: float
    hits: float
    queries: float
    per_upstream: dict[str, tuple[float, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def prompt(self) -> int:
        """Σ prompt tokens of the successful requests."""
        return sum(r.prompt for r in self.records if r.ok)

    @property
    def cached(self) -> int:
        """Σ cached prompt tokens of the successful requests."""
        return sum(r.cached for r in self.records if r.ok)

    @property
    def ok(self) -> int:
        """Successful requests."""
        return sum(r.ok for r in self.records)


async def _parsed(raw: Any) -> Any:
    """A raw response's parsed body (the SDKs differ in whether `parse()` of an async client is awaitable)."""
    out = raw.parse()
    return await out if inspect.isawaitable(out) else out


def _int(v: Any) -> int:
    return v if isinstance(v, int) else 0


async def send_messages(client: anthropic.AsyncAnthropic, kw: dict[str, Any], max_tokens: int, stream: bool,
                        rec: Record) -> None:
    """One Messages request with the Anthropic SDK; usage (prompt = input + cache read + cache creation)."""
    raw = await client.messages.with_raw_response.create(model=MODEL, max_tokens=max_tokens, stream=stream, **kw)
    rec.header = raw.headers.get("x-kvgate-normalized", "")
    usage: dict[str, Any] = {}
    if stream:
        events = await _parsed(raw)
        async for ev in events:
            if ev.type == "message_start":
                usage.update(ev.message.usage.model_dump(exclude_none=True))
            elif ev.type == "message_delta":
                usage.update(ev.usage.model_dump(exclude_none=True))
    else:
        usage = (await _parsed(raw)).usage.model_dump(exclude_none=True)
    read = _int(usage.get("cache_read_input_tokens"))
    rec.prompt = _int(usage.get("input_tokens")) + read + _int(usage.get("cache_creation_input_tokens"))
    rec.cached = read


async def send_responses(client: openai.AsyncOpenAI, kw: dict[str, Any], max_tokens: int, stream: bool,
                         rec: Record) -> None:
    """One Responses request with the OpenAI SDK; usage from the response (or response.completed)."""
    raw = await client.responses.with_raw_response.create(model=MODEL, max_output_tokens=max_tokens, stream=stream,
                                                          **kw)
    rec.header = raw.headers.get("x-kvgate-normalized", "")
    usage = None
    if stream:
        events = await _parsed(raw)
        async for ev in events:
            if ev.type in ("response.completed", "response.incomplete"):
                usage = ev.response.usage
    else:
        usage = (await _parsed(raw)).usage
    if usage is not None:
        rec.prompt = usage.input_tokens
        rec.cached = usage.input_tokens_details.cached_tokens if usage.input_tokens_details else 0


async def drive(base: str, arm: Arm, sessions: list[AgentSession], args: argparse.Namespace) -> list[Record]:
    """Every turn of every session, in the fixed closed-loop order, at most `concurrency` in flight."""
    order = issue_order([s.turns for s in sessions], args.concurrency)
    slots = asyncio.Semaphore(args.concurrency)
    done = {s.index: asyncio.Event() for s in sessions}
    for e in done.values():
        e.set()
    records: list[Record] = []
    tasks: list[asyncio.Task[None]] = []
    timeout = 120.0
    failed = 0
    if arm.trace == "claude":
        ant = anthropic.AsyncAnthropic(base_url=base, api_key=arm.api_key, max_retries=0, timeout=timeout)
        close: Callable[[], Any] = ant.close

        async def call(kw: dict[str, Any], rec: Record) -> None:
            await send_messages(ant, kw, args.max_tokens, args.stream, rec)
    else:
        oai = openai.AsyncOpenAI(base_url=base + "/v1", api_key=arm.api_key, max_retries=0, timeout=timeout)
        close = oai.close

        async def call(kw: dict[str, Any], rec: Record) -> None:
            await send_responses(oai, kw, args.max_tokens, args.stream, rec)

    async def one(s: AgentSession, rec: Record) -> None:
        nonlocal failed
        t0 = time.perf_counter()
        try:
            await call(build_request(arm.trace, s, rec.turn, static=arm.static), rec)
            rec.ok = True
        except (anthropic.APIError, openai.APIError, httpx.HTTPError) as e:
            failed += 1
            rec.error = f"{type(e).__name__}: {str(e)[:160]}"
        finally:
            rec.latency_s = time.perf_counter() - t0
            slots.release()
            done[s.index].set()

    try:
        for si, turn in order:
            if failed > args.max_errors:  # an upstream went away: the arm no longer measures the cache
                break
            await done[si].wait()
            await slots.acquire()
            done[si].clear()
            rec = Record(session=si, turn=turn)
            records.append(rec)
            tasks.append(asyncio.create_task(one(sessions[si], rec)))
        await asyncio.gather(*tasks)
    finally:
        await close()
    return records


async def _prefix_counters(http: aiohttp.ClientSession, replicas: list[str]) -> dict[str, tuple[float, float] | None]:
    """(hits, queries) of every upstream's prefix cache; None for one that does not answer (restarting)."""
    out: dict[str, tuple[float, float] | None] = {}
    for url in replicas:
        try:
            s = await scrape(http, url)
        except (aiohttp.ClientError, TimeoutError):
            out[url] = None
            continue
        out[url] = (counter_sum(s, "vllm:prefix_cache_hits_total"), counter_sum(s, "vllm:prefix_cache_queries_total"))
    return out


async def _wait_idle(http: aiohttp.ClientSession, replicas: list[str], wait_s: float) -> bool:
    """Wait until no reachable upstream runs or queues a request (other clients share the real servers)."""
    deadline = time.monotonic() + wait_s
    while True:
        busy = 0.0
        for url in replicas:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                s = await scrape(http, url)
                busy += counter_sum(s, "vllm:num_requests_running") + counter_sum(s, "vllm:num_requests_waiting")
        if busy == 0:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(1.0)


async def run_arm(http: aiohttp.ClientSession, base: str, replicas: list[str], arm: Arm,
                  args: argparse.Namespace) -> ArmResult:
    """Replay the arm's sessions and read the upstream prefix-cache counters around it."""
    notes = []
    healthy = await asyncio.to_thread(wait_upstreams, replicas, args.wait_s)
    if len(healthy) < len(replicas):
        notes.append(f"down at the start: {sorted(set(replicas) - set(healthy))}")
    if not await _wait_idle(http, replicas, wait_s=30):
        notes.append("upstreams busy with other clients at the start")
    if args.reset:
        notes += await reset_prefix_caches(http, replicas)
    before = await _prefix_counters(http, replicas)
    t0 = time.perf_counter()
    records = await drive(base, arm, make_sessions(arm.trace, args.sessions, args.turns, args.seed), args)
    wall = time.perf_counter() - t0
    await asyncio.sleep(0.5)  # let the engines' counters catch up with the last request
    after = await _prefix_counters(http, replicas)
    per: dict[str, tuple[float, float]] = {}
    for u in replicas:
        b, a = before[u], after[u]
        if b is None or a is None or a[1] < b[1]:  # down, or restarted (its counters began again) in the window
            notes.append(f"{u} down or restarted during the arm (its counters left out)")
            continue
        per[u] = (a[0] - b[0], a[1] - b[1])
    return ArmResult(arm=arm, records=records, wall_s=wall, hits=sum(h for h, _ in per.values()),
                     queries=sum(q for _, q in per.values()), per_upstream=per, notes=notes)


# -- output ----------------------------------------------------------------------------------------


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _of(v: float, ceiling: float) -> str:
    return f"{v / ceiling * 100:.0f}%" if ceiling else "-"


def markdown_table(trace: str, results: list[ArmResult], args: argparse.Namespace) -> str:
    """One trace's table (every arm against the ceiling) and the notes that explain it."""
    ceil = next(r for r in results if r.arm.name == "ceiling")
    ceil_ratio = ceil.cached / ceil.prompt if ceil.prompt else 0.0
    rows = ["| arm | requests | prompt tokens | cached tokens | cached ratio | % of ceiling (cached tokens) "
            "| % of ceiling (ratio) | vLLM /metrics hit ratio |",
            "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in results:
        ratio = r.cached / r.prompt if r.prompt else 0.0
        rows.append(f"| {r.arm.name} | {r.ok}/{len(r.records)} | {r.prompt:,} | {r.cached:,} | {_pct(ratio)} "
                    f"| {_of(r.cached, ceil.cached)} | {_of(ratio, ceil_ratio)} "
                    f"| {_pct(r.hits / r.queries if r.queries else None)} |")
    api = "/v1/messages (anthropic SDK)" if trace == "claude" else "/v1/responses (openai SDK)"
    head = (f"**{trace}** — {api}, {args.sessions} sessions x {args.turns} turns, {args.concurrency} concurrent, "
            f"max_tokens {args.max_tokens}{', streamed' if args.stream else ''}\n\n")
    notes = []
    for r in results:
        headers = Counter(x.header.split(";tools=")[0] for x in r.records if x.ok)
        hdr = ", ".join(f"`{h}` x{n}" for h, n in headers.most_common())
        by_turn: dict[int, list[int]] = {}
        for x in r.records:
            if x.ok:
                by_turn.setdefault(x.turn, [0, 0])
                by_turn[x.turn][0] += x.cached
                by_turn[x.turn][1] += x.prompt
        turns = ", ".join(f"t{t}: {_pct(c / p if p else None)}" for t, (c, p) in sorted(by_turn.items()))
        foreign = r.queries - r.prompt
        spread = ", ".join(f"{u.rsplit(':', 1)[-1]} {h:,.0f}/{q:,.0f}" for u, (h, q) in r.per_upstream.items())
        errors = [x.error for x in r.records if not x.ok]
        notes.append(f"- {r.arm.name}: x-kvgate-normalized {hdr or '(none)'}; cached by turn: {turns}; "
                     f"hits/queries by upstream port: {spread}; Δqueries - Σprompt = {foreign:+,.0f}; "
                     f"{r.wall_s:.0f} s" + (f"; errors: {errors[:2]}" if errors else "")
                     + (f"; {'; '.join(r.notes)}" if r.notes else ""))
    return head + "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"


# -- processes -------------------------------------------------------------------------------------


def _provenance() -> str:
    """The checkout's commit, and whether app/normalize had uncommitted changes (the gateway runs the tree)."""
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "app/normalize")
    return f"commit {head}" + (" with uncommitted app/normalize changes" if dirty else "")


def wait_upstreams(replicas: list[str], wait_s: float) -> list[str]:
    """The replicas whose /health answers 200, waiting up to `wait_s` for all of them."""
    deadline = time.monotonic() + wait_s
    while True:
        healthy = []
        for url in replicas:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    healthy.append(url)
        if len(healthy) == len(replicas) or time.monotonic() > deadline:
            return healthy
        print(f"[{datetime.now(UTC):%H:%M:%S}] waiting for {sorted(set(replicas) - set(healthy))} ...",
              file=sys.stderr)
        time.sleep(15)


@contextlib.contextmanager
def sim_upstreams(n: int) -> Iterator[list[str]]:
    """`n` x `kvgate sim` (SmolLM2 profile, 128-token blocks, tools not rendered: like vLLM-CPU) for a plumbing
    run; yields their URLs."""
    from normalize_eval import _free_port, _stop, _wait_healthy

    procs, urls = [], []
    try:
        for _ in range(n):
            port = _free_port()
            cmd = [sys.executable, "-m", "app.cli", "sim", "--port", str(port), "--model", MODEL, "--profile",
                   "cpu-smollm2", "--block-size", "128", "--no-render-tools", "--time-scale", "4",
                   "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
            if SMOLLM2_TOKENIZER.exists():
                cmd += ["--tokenizer", str(SMOLLM2_TOKENIZER)]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(procs, urls, strict=True):
            _wait_healthy(proc, url + "/health", "kvgate sim")
        yield urls
    finally:
        for proc in procs:
            _stop(proc)


def gateway_config(replicas: list[str], arms: list[Arm]) -> dict[str, Any]:
    """One model, one prefix-affinity pool over every upstream, one tenant per arm; in-memory store."""
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": MODEL, "pools": ["main"]}],
        "pools": {"main": {"role": "interactive", "served_model": MODEL, "replicas": replicas,
                           "policy": "prefix_affinity",
                           "price": {"gpu_hour_usd": 2.5, "gpus": 1, "capacity_tokens_per_s": 1500.0}}},
        "tenants": [{"id": a.tenant, "api_keys": [a.api_key], "default_class": "interactive",
                     "normalize": a.normalize} for a in arms],
        "auth": {"required": True},
        "upstream": {"read_timeout_s": 300},
    }


async def evaluate(base: str, replicas: list[str], arms: list[Arm], args: argparse.Namespace) -> list[ArmResult]:
    """Every arm, one after the other."""
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        for arm in arms:
            print(f"[{datetime.now(UTC):%H:%M:%S}] {arm.trace}: arm {arm.name} ...", file=sys.stderr)
            out.append(await run_arm(http, base, replicas, arm, args))
    return out


def main() -> int:
    """CLI entry."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated, of {', '.join(TRACES)}")
    p.add_argument("--sessions", type=int, default=6)
    p.add_argument("--turns", type=int, default=6, help="up to ~7 stays under SmolLM2's 2,048 tokens")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--stream", action="store_true", help="stream every request (usage from the final events)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-errors", type=int, default=2, help="stop an arm after this many failed requests")
    p.add_argument("--replicas", default=",".join(VLLM_REPLICAS))
    p.add_argument("--wait-s", type=float, default=600, help="how long to wait for every replica's /health")
    p.add_argument("--reset", action="store_true", help="POST /reset_prefix_cache to every upstream before each arm "
                   "(not needed for isolation: every arm has its own cache_salt; it disturbs other users)")
    p.add_argument("--sim", action="store_true", help="run against two `kvgate sim` processes (plumbing check)")
    p.add_argument("--json", default=None, help="write every request's record here")
    args = p.parse_args()
    traces = [t for t in args.traces.split(",") if t]
    if unknown := set(traces) - set(TRACES):
        p.error(f"unknown traces: {sorted(unknown)}")

    started = datetime.now(UTC)
    run = f"{started:%H%M%S}"
    arms = [Arm(t, name, run) for t in traces for name in ARM_NAMES]
    with contextlib.ExitStack() as stack:
        if args.sim:
            replicas = stack.enter_context(sim_upstreams(2))
        else:
            wanted = [u for u in args.replicas.split(",") if u]
            replicas = wait_upstreams(wanted, args.wait_s)
            if not replicas:
                print("no upstream is healthy", file=sys.stderr)
                return 2
            if len(replicas) < len(wanted):
                print(f"running on {replicas} only: {sorted(set(wanted) - set(replicas))} stayed down",
                      file=sys.stderr)
        base = stack.enter_context(gateway_process(gateway_config(replicas, arms)))
        results = asyncio.run(evaluate(base, replicas, arms, args))
    errors = 0
    for trace in traces:
        block = markdown_table(trace, [r for r in results if r.arm.trace == trace], args)
        print(block, flush=True)
    for r in results:
        errors += len(r.records) - r.ok
    print(f"Run {started:%Y-%m-%d %H:%M} UTC, {(datetime.now(UTC) - started).total_seconds():.0f} s wall, "
          f"upstreams: {', '.join(replicas)}; {_provenance()}.")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(
            [{"trace": r.arm.trace, "arm": r.arm.name, "wall_s": r.wall_s, "hits": r.hits, "queries": r.queries,
              "records": [vars(x) for x in r.records]} for r in results], option=orjson.OPT_INDENT_2))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
