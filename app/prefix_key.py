"""The routing key: a hash of a request's leading content, block-aligned and salted per tenant.

The gateway has no tokenizer, so blocks are counted in characters: CHUNK_CHARS = 64 characters is about
16 tokens of English or code, i.e. one vLLM KV block. Two requests get the same key when their first
PREFIX_CHUNKS x 64 characters agree — exactly when they would share that many cached blocks.

Why PREFIX_CHUNKS = 16 (1,024 characters, ≈256 tokens, ≈16 blocks):
- it must separate different system prompts: real ones diverge within their first few hundred characters
  (role, product, task); prompts that agree on 1 KB share ≥16 cached blocks, so co-locating them is right;
- it must not change across the turns of one session: the key reads only content every turn repeats —
  the leading system/developer messages, then the tools, then the first conversational message — never
  the growing tail of the history, and only whole chunks, so turn 1 and turn 20 hash the same text;
- with a short system prompt the first user message falls inside the window, so separate sessions get
  separate homes (their history is the cache worth keeping) instead of all piling onto one replica;
- 1 KB hashes in about a microsecond; a longer window buys nothing for routing.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

import orjson

CHUNK_CHARS = 64
PREFIX_CHUNKS = 16
HEAD_CHARS = CHUNK_CHARS * PREFIX_CHUNKS
TOKENS_PER_CHUNK = 16  # token-id prompts: one KV block per chunk


def prompt_head(prompt: Any, chunks: int = PREFIX_CHUNKS) -> str | bytes:
    """Leading part of a completions prompt / embeddings input (str, token ids, or a batch of either).

    Text comes back as a string still to be chunk-aligned; token ids come back as final bytes, already
    cut at a whole number of TOKENS_PER_CHUNK blocks.
    """
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: the first prompt decides
    if isinstance(prompt, str):
        return prompt[: chunks * CHUNK_CHARS]
    if isinstance(prompt, list):
        n = min(len(prompt), chunks * TOKENS_PER_CHUNK) // TOKENS_PER_CHUNK * TOKENS_PER_CHUNK
        try:
            return orjson.dumps(prompt[:n])
        except TypeError:  # not JSON-serializable
            return b""
    return ""


def routing_key(head: str | bytes, salt: str) -> int:
    """64-bit key of a prompt view's leading content (`PromptView.key_head`), block-aligned and mixed with
    `salt` (tenants never share homes unless they share a salt, mirroring vLLM's cache_salt)."""
    if isinstance(head, str):
        head = head[: len(head) // CHUNK_CHARS * CHUNK_CHARS].encode("utf-8", "surrogatepass")
    h = blake2b(salt.encode(), digest_size=8)
    h.update(b"\x00")
    h.update(head)
    return int.from_bytes(h.digest(), "little")
