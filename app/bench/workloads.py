"""Request generators for the bench workloads: deterministic per seed, sessions replayable in any order.

Every session draws from its own RNG (seeded by the run seed and the session index), so what a session
sends does not depend on how the runner interleaves sessions.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

WORKLOADS = ("chat", "agent", "agent-static", "bulk", "mixed", "synthetic", "code-chat")

_WORD_TEXT = (
    "account agent api audit batch billing branch buffer build cache call change check client cluster commit "
    "config context customer data deploy detail document error event field file filter format gateway graph "
    "handler header incident index input issue job key label latency layer limit log memory message metric "
    "model module network node note order output owner packet page parser patch path payload plan policy pool "
    "port priority process queue quota record region release replica report request resource response result "
    "retry review role route rule schema scope secret server service session shard signal source span stage "
    "state status step storage stream summary system table task tenant test thread token tool trace update "
    "user value version window worker workflow"
)
_WORDS = tuple(_WORD_TEXT.split())

_TOPICS = (
    "how a hash map handles collisions", "why the sky looks blue", "what a mutex protects",
    "how TCP slow start works", "the difference between a process and a thread", "what a B-tree is",
    "how HTTPS certificates are checked", "why databases use write-ahead logs", "what eventual consistency means",
    "how garbage collection finds live objects", "what a CPU cache line is", "how DNS resolution works",
    "why floating point addition is not associative", "what a bloom filter answers", "how rate limiting works",
    "what a Merkle tree proves",
)

_BASE_TIME = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)

_TOOL_SPECS: tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...] = (
    ("search_docs", "Search the internal documentation and return the best matching passages.",
     (("query", "string", "What to look for."), ("limit", "integer", "How many passages to return."))),
    ("read_file", "Read a file from the workspace and return its text.",
     (("path", "string", "Path relative to the workspace root."), ("start_line", "integer", "First line."),
      ("end_line", "integer", "Last line, inclusive."))),
    ("write_file", "Write text to a file in the workspace, replacing its contents.",
     (("path", "string", "Path relative to the workspace root."), ("content", "string", "The new contents."))),
    ("run_shell", "Run a shell command in the sandbox and return its output and exit code.",
     (("command", "string", "The command line."), ("timeout_s", "integer", "Seconds before it is killed."))),
    ("http_get", "Fetch a URL from the allow-listed internal services.",
     (("url", "string", "The URL to fetch."), ("headers", "object", "Extra request headers."))),
    ("create_ticket", "Open a ticket in the issue tracker.",
     (("title", "string", "One-line summary."), ("body", "string", "Details."),
      ("priority", "string", "One of low, normal, high."))),
    ("query_db", "Run a read-only SQL query against the analytics replica.",
     (("sql", "string", "The query."), ("max_rows", "integer", "Row limit."))),
    ("send_message", "Send a chat message to a team channel.",
     (("channel", "string", "Channel name."), ("text", "string", "Message text."))),
)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _token_counter(tokenizer: str | None) -> Callable[[str], int]:
    """Counts tokens with a tokenizer.json (a file or the folder holding it), else by ~4 characters a token."""
    if tokenizer is None:
        return lambda text: max(1, round(len(text) / 4))
    from pathlib import Path

    from tokenizers import Tokenizer

    path = Path(tokenizer)
    tok = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def sized_prompt(rng: random.Random, tokens: int, count: Callable[[str], int]) -> str:
    """Random words whose token count is `tokens` (or the nearest reachable count just above)."""
    words = [rng.choice(_WORDS) for _ in range(tokens)]
    # Words are about one token each; a few passes of correcting by the measured difference converge.
    for _ in range(8):
        diff = tokens - count(" ".join(words))
        if diff == 0:
            break
        if diff > 0:
            words.extend(rng.choice(_WORDS) for _ in range(max(1, diff // 2)))
        else:
            del words[max(1, len(words) + min(diff // 2, -1)):]
    return " ".join(words)


def _sentence(rng: random.Random) -> str:
    s = _words(rng, rng.randint(8, 18))
    return s[0].upper() + s[1:] + "."


def agent_system_prompt(seed: int, target_chars: int = 5800) -> str:
    """The static part of the agent system prompt (~1.45k tokens by chars/4), identical for a given seed."""
    rng = random.Random(f"agent-system-{seed}")
    parts = ["You are Atlas, an operations agent for the platform team. Follow these rules exactly.\n"]
    n = 1
    while sum(len(p) for p in parts) < target_chars:
        parts.append(f"{n}. {_sentence(rng)} {_sentence(rng)}\n")
        n += 1
    return "".join(parts)


def tool_definitions() -> list[dict[str, Any]]:
    """The eight tools of the agent workload, in their canonical key order."""
    tools = []
    for name, description, params in _TOOL_SPECS:
        properties = {p: {"type": t, "description": d} for p, t, d in params}
        tools.append({
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": properties, "required": [params[0][0]]},
            },
        })
    return tools


def shuffle_keys(value: Any, rng: random.Random) -> Any:
    """A copy of `value` whose dicts (at every depth) have their keys in random order; lists keep order."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffle_keys(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [shuffle_keys(v, rng) for v in value]
    return value


@dataclass(slots=True)
class BenchRequest:
    """One request to send: body, extra headers, the key to send it with, and where it came from."""

    body: dict[str, Any]
    headers: dict[str, str]
    api_key: str | None
    session: int
    turn: int
    tenant: int
    route_class: str


@dataclass(slots=True)
class Session:
    """A conversation: each turn sends the history so far plus a new user message."""

    index: int
    tenant: int
    api_key: str | None
    route_class: str
    user_turns: list[str]
    max_tokens: int
    rng: random.Random
    system: str | None = None
    volatile_header: bool = False
    tools: list[dict[str, Any]] | None = None
    shuffle_tools: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    turn: int = 0

    @property
    def done(self) -> bool:
        """No turns left to send."""
        return self.turn >= len(self.user_turns)

    def _header(self) -> str:
        # What agents put on top of their system prompt: the current time and a few ids, new per request.
        when = _BASE_TIME + timedelta(seconds=self.index * 37 + self.turn * 11, milliseconds=self.rng.randint(0, 999))
        return (
            f"Current time: {when.isoformat(timespec='milliseconds').replace('+00:00', 'Z')}\n"
            f"Request ID: req_{self.rng.getrandbits(64):016x}\n"
            f"Session ID: sess_{self.index:06d}-{self.rng.getrandbits(32):08x}\n"
            f"User ID: user_{self.tenant:03d}{self.index % 97:02d}\n\n"
        )

    def next_request(self, model: str, stream: bool) -> BenchRequest:
        """The next turn's request (call `record_reply` with its answer before asking for another)."""
        messages: list[dict[str, Any]] = []
        if self.system is not None:
            system = (self._header() + self.system) if self.volatile_header else self.system
            messages.append({"role": "system", "content": system})
        messages.extend(self.history)
        messages.append({"role": "user", "content": self.user_turns[self.turn]})
        body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": self.max_tokens,
                                "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.tools is not None:
            body["tools"] = [shuffle_keys(t, self.rng) for t in self.tools] if self.shuffle_tools \
                else copy.deepcopy(self.tools)
        body.update(self.extra_body)
        return BenchRequest(body, dict(self.headers), self.api_key, self.index, self.turn, self.tenant,
                            self.route_class)

    def record_reply(self, text: str) -> None:
        """Append this turn's user message and the assistant's reply to the history; advance a turn."""
        self.history.append({"role": "user", "content": self.user_turns[self.turn]})
        self.history.append({"role": "assistant", "content": text or "(no reply)"})
        self.turn += 1


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    """Knobs shared by all workloads."""

    seed: int = 0
    tenants: int = 1
    api_keys: tuple[str, ...] = ()
    api_key: str | None = None
    max_tokens: int | None = None
    mixed_ratio: float = 0.8
    class_header: str = "x-kvgate-class"
    # "none" works against an engine started without tool parsing (vLLM refuses "auto" then) and still puts
    # the tools into the prompt; "auto" is what a real agent sends; "omit" leaves the field out.
    tool_choice: str = "none"
    # synthetic: prompts of exactly this many tokens (by `tokenizer`, else ~4 characters per token)
    prompt_tokens: int = 256
    tokenizer: str | None = None

    def tenant_count(self) -> int:
        """Tenants to spread sessions over: one per given key, else `tenants`."""
        return len(self.api_keys) if self.api_keys else max(1, self.tenants)

    def key_for(self, tenant: int) -> str | None:
        """The API key a tenant sends."""
        if self.api_keys:
            return self.api_keys[tenant % len(self.api_keys)]
        if self.tenant_count() == 1:
            return self.api_key
        return f"sk-bench-tenant-{tenant}"


class Workload:
    """Makes session number i of a named workload; the same (name, options, i) always gives the same session."""

    def __init__(self, name: str, options: WorkloadOptions) -> None:
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
        self.name = name
        self.options = options
        self._agent_system = agent_system_prompt(options.seed) if name.startswith("agent") else ""
        self._tools = tool_definitions()
        makers: dict[str, Callable[[int, random.Random], Session]] = {
            "chat": self._chat, "agent": self._agent, "agent-static": self._agent, "bulk": self._bulk,
            "mixed": self._mixed, "synthetic": self._synthetic, "code-chat": self._code_chat,
        }
        self._make = makers[name]
        self._count = _token_counter(options.tokenizer) if name == "synthetic" else None

    def session(self, index: int) -> Session:
        """Session number `index` (fresh, nothing sent yet)."""
        # agent-static draws exactly agent's sessions (same turns, same counts), minus the volatile content,
        # so the ceiling arm replays the same conversation.
        family = "agent" if self.name == "agent-static" else self.name
        rng = random.Random(f"{family}-{self.options.seed}-{index}")
        return self._make(index, rng)

    def _tenant(self, index: int) -> int:
        return index % self.options.tenant_count()

    def _base(self, index: int, rng: random.Random, route_class: str, turns: list[str], max_tokens: int) -> Session:
        tenant = self._tenant(index)
        return Session(index=index, tenant=tenant, api_key=self.options.key_for(tenant), route_class=route_class,
                       user_turns=turns, max_tokens=self.options.max_tokens or max_tokens, rng=rng)

    def _chat(self, index: int, rng: random.Random) -> Session:
        question = f"In two or three sentences, explain {rng.choice(_TOPICS)}. Context: {_words(rng, 12)}."
        s = self._base(index, rng, "interactive", [question], 128)
        s.system = "You are a concise, helpful assistant."
        return s

    def _agent(self, index: int, rng: random.Random) -> Session:
        turns = [f"Task {k + 1}: {_sentence(rng)} Use the tools if needed and report what you did."
                 for k in range(rng.randint(3, 6))]
        s = self._base(index, rng, "interactive", turns, 192)
        s.system = self._agent_system
        s.tools = self._tools
        if self.options.tool_choice != "omit":
            s.extra_body = {"tool_choice": self.options.tool_choice}
        # agent-static is the ceiling arm: nothing volatile, tools byte-identical on every request.
        s.volatile_header = s.shuffle_tools = self.name == "agent"
        return s

    def _bulk(self, index: int, rng: random.Random) -> Session:
        prompt = (f"Write a detailed technical report on {rng.choice(_TOPICS)}, with sections, examples and a "
                  f"summary. Audience notes: {_words(rng, 20)}.")
        s = self._base(index, rng, "bulk", [prompt], 1024)
        s.extra_body = {"service_tier": "flex"}
        return s

    def _synthetic(self, index: int, rng: random.Random) -> Session:
        # Fixed-shape requests, as GuideLLM's synthetic data sends them: one turn of random words, no system
        # prompt, a fresh prompt per session so nothing is cached.
        assert self._count is not None
        prompt = sized_prompt(rng, self.options.prompt_tokens, self._count)
        return self._base(index, rng, "interactive", [prompt], 128)

    def _code_chat(self, index: int, rng: random.Random) -> Session:
        # Interactive traffic of two kinds, `mixed_ratio` of it code edits: a fenced function to change and return
        # whole (an ngram proposer's drafts are accepted often: the output repeats the input), the rest chat.
        if rng.random() >= self.options.mixed_ratio:
            return self._chat(index, rng)
        name = "_".join(rng.sample(_WORDS, 2))
        body = "\n".join(f"    {rng.choice(_WORDS)}_{k} = {rng.choice(_WORDS)}({rng.choice(_WORDS)}, {k})"
                         for k in range(rng.randint(12, 24)))
        task = (f"Rename `{rng.choice(_WORDS)}` to `{rng.choice(_WORDS)}` in this function and return the whole "
                f"function, nothing else.\n```python\ndef {name}(x):\n{body}\n    return x\n```")
        s = self._base(index, rng, "interactive", [task], 256)
        s.system = "You are a careful coding assistant."
        return s

    def _mixed(self, index: int, rng: random.Random) -> Session:
        interactive = rng.random() < self.options.mixed_ratio
        s = self._chat(index, rng) if interactive else self._bulk(index, rng)
        s.headers[self.options.class_header] = s.route_class
        return s
