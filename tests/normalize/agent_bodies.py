"""Hand-made agent sessions shaped as shared/reference/agents.md describes what Claude Code 2.1.197, Codex CLI
0.171.0 and opencode 1.18.33 send to a self-hosted base URL (the captured fixtures pin the real bodies).

A session is a list of requests (kind, headers, body): each user turn is answered first with a tool call, then,
after the tool's result, with text; every request repeats the history before it (append-only), as the clients do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Request = tuple[str, dict[str, str], dict[str, Any]]


def _static(topic: str, chars: int) -> str:
    """Static markdown instructions: headings, bullets, an example, a code fence."""
    out: list[str] = []
    i = 0
    while sum(len(x) + 1 for x in out) < chars:
        i += 1
        out += [
            f"# {topic} {i}",
            f"- Rule {i}.1: read the file before you edit it, and keep edits small.",
            f"- Rule {i}.2: run the tests that cover the change; report failures verbatim.",
            "<example>",
            "user: what does this do?",
            "assistant: It parses the config and returns the defaults.",
            "</example>",
            "```bash",
            "# a comment, not a heading",
            "git status --short",
            "```",
            "",
        ]
    return "\n".join(out)


@dataclass(frozen=True)
class Workspace:
    """Where a session runs: its directory, git state and day."""

    cwd: str = "/tmp/lab/repo1"
    status: str = ""
    commits: str = "3f2a9c1 initial commit"
    branch: str = "main"
    day: str = "2026-12-01"


def _tools_anthropic(n: int = 24) -> list[dict[str, Any]]:
    return [
        {
            "name": f"Tool{i:02d}",
            "description": f"Tool number {i}: does one thing well. " * 8,
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        }
        for i in range(n)
    ]


def _tools_chat(n: int = 12) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                          "parameters": t["input_schema"]}}
        for t in _tools_anthropic(n)
    ]


CLAUDE_HEAD = _static("Doing tasks", 12_000)
CLAUDE_MIDDLE = _static("Tool usage", 13_000)
CLAUDE_END = _static("Code references", 3_000)
OPENCODE_STATIC = _static("Opencode", 9_000)
CODEX_INSTRUCTIONS = _static("Codex", 17_000)
OUTPUT_3K = "\n".join(f"{i:05d} line of tool output with some words in it, as a grep prints" for i in range(180))


def claude_system(ws: Workspace) -> list[dict[str, Any]]:
    """Claude Code's system blocks: billing, identity, then the instructions with the dynamic sections deep in."""
    slug = "".join(c if c.isalnum() else "-" for c in ws.cwd)
    status = ws.status or "(clean)"
    big = (
        CLAUDE_HEAD
        + "\n# auto memory\n\nYou have a persistent auto memory directory at "
        + f"`/root/.claude/projects/{slug}/memory/`. Its contents persist across conversations.\n"
        + "- `MEMORY.md` is always loaded into your system prompt.\n\n"
        + CLAUDE_MIDDLE
        + "\n# Environment\nYou have been invoked in the following environment: \n"
        + f" - Primary working directory: {ws.cwd}\n - Is a git repository: true\n - Platform: linux\n"
        + " - Shell: bash\n - OS Version: Linux 6.8.0\n - You are powered by the model qwen3-coder.\n\n"
        + CLAUDE_END
        + "\ngitStatus: This is the git status at the start of the conversation. Note that this status is a "
        + "snapshot in time, and will not update during the conversation.\n"
        + f"Current branch: {ws.branch}\n\nMain branch (you will usually use this for PRs): main\n\n"
        + f"Status:\n{status}\n\nRecent commits:\n{ws.commits}"
    )
    return [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": big, "cache_control": {"type": "ephemeral"}},
    ]


def claude_session(sid: str, ws: Workspace, turns: int) -> list[Request]:
    """A Claude Code session: every turn a tool_use round trip, then text."""
    headers = {"x-claude-code-session-id": sid}
    first = [
        {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use the following "
                                 f"context:\n# currentDate\nToday's date is {ws.day}.\n</system-reminder>"},
    ]
    messages: list[dict[str, Any]] = []
    out: list[Request] = []
    for turn in range(turns):
        prompt = {"type": "text", "text": f"Task {turn}: look at src/module{turn}.py and fix the bug."}
        messages.append({"role": "user", "content": [*first, prompt] if turn == 0 else [prompt]})
        for step in range(2):
            body = {
                "model": "qwen3-coder", "max_tokens": 32000, "stream": True, "system": claude_system(ws),
                "tools": _tools_anthropic(), "messages": json.loads(json.dumps(messages)),
                "metadata": {"user_id": json.dumps({"device_id": "d" * 64, "session_id": sid})},
            }
            out.append(("first" if turn == 0 and step == 0 else "turn" if step == 0 else "tool", headers, body))
            if step == 0:
                call = f"toolu_{sid[:4]}{turn}"
                messages.append(
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": call,
                                "name": "Tool03",
                                "input": {"path": f"src/module{turn}.py"},
                            }
                        ],
                    }
                )
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call, "content": OUTPUT_3K}]})
            else:
                messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Fixed {turn}."}]})
    return out


def opencode_system(ws: Workspace) -> str:
    return (
        OPENCODE_STATIC
        + "\nHere is some useful information about the environment you are running in:\n<env>\n"
        + f"  Working directory: {ws.cwd}\n  Workspace root folder: {ws.cwd}\n  Is directory a git repo: yes\n"
        + "  Platform: linux\n  Today's date: Tue Dec 01 2026\n</env>"
    )


def opencode_session(sid: str, ws: Workspace, turns: int) -> list[Request]:
    """An opencode session over chat completions (no session header)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": opencode_system(ws)}]
    out: list[Request] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"[{sid}] task {turn}: refactor src/module{turn}.py"})
        for step in range(2):
            body = {"model": "qwen3-coder", "stream": True, "tools": _tools_chat(),
                    "messages": json.loads(json.dumps(messages))}
            out.append(("first" if turn == 0 and step == 0 else "turn" if step == 0 else "tool", {}, body))
            if step == 0:
                call = f"call_{sid[:4]}{turn}"
                messages.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": call,
                                "type": "function",
                                "function": {
                                    "name": "Tool03",
                                    "arguments": json.dumps({"path": f"src/module{turn}.py"}),
                                },
                            }
                        ],
                    }
                )
                messages.append({"role": "tool", "tool_call_id": call, "content": OUTPUT_3K})
            else:
                messages.append({"role": "assistant", "content": f"Refactored {turn}."})
    return out


def codex_session(sid: str, ws: Workspace, turns: int) -> list[Request]:
    """A Codex session over Responses: developer item, then the user <environment_context>, ~3.6k-token outputs."""
    headers = {"session-id": sid}
    env = (
        f"<environment_context>\n  <cwd>{ws.cwd}</cwd>\n  <shell>bash</shell>\n"
        f"  <current_date>{ws.day}</current_date>\n  <timezone>Etc/UTC</timezone>\n</environment_context>"
    )
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "<permissions instructions>\nsandbox: workspace-write\n"
                                           "</permissions instructions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": env}]},
    ]
    tools = [
        {
            "type": "function",
            "name": f"tool{i}",
            "description": "does a thing " * 20,
            "parameters": {"type": "object", "properties": {}},
        }
        for i in range(8)
    ] + [{"type": "web_search"}]
    out: list[Request] = []
    for turn in range(turns):
        items.append(
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"Task {turn}: fix the failing test {turn}."}],
            }
        )
        for step in range(2):
            body = {"model": "qwen3-coder", "instructions": CODEX_INSTRUCTIONS, "input": json.loads(json.dumps(items)),
                    "tools": tools, "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
                    "prompt_cache_key": sid}
            out.append(("first" if turn == 0 and step == 0 else "turn" if step == 0 else "tool", headers, body))
            if step == 0:
                call = f"call_{sid[:4]}{turn}"
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call,
                        "name": "tool1",
                        "arguments": json.dumps({"cmd": ["pytest", "-x"]}),
                    }
                )
                items.append({"type": "function_call_output", "call_id": call, "output": OUTPUT_3K})
            else:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": f"Fixed {turn}."}]})
    return out


SESSIONS = {"messages": claude_session, "chat": opencode_session, "responses": codex_session}
