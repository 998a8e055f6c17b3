"""Token ids of a chat request, the way vLLM 0.32 renders and tokenizes it, and its block hashes.

Rendering follows transformers' apply_chat_template (what vLLM calls for HF models): a sandboxed Jinja
environment with trim_blocks/lstrip_blocks and loopcontrols, a `tojson` that neither escapes HTML nor
sorts keys, `raise_exception` and `strftime_now`; the template sees `messages`, `tools`,
`add_generation_prompt` (True unless the body says otherwise), `continue_final_message`, the tokenizer's
special tokens, and the request's `chat_template_kwargs`. Messages get vLLM's "string" content format
(text parts joined by newlines) and assistant tool-call arguments parsed from JSON, as vLLM's
_postprocess_messages does. Tokenization adds no special tokens (vLLM's chat default).

Hot path: a rendered prompt is split at the tokenizer's special tokens, which HF tokenizers never merge
across, and each piece's ids are cached (bounded LRU), so a stable system prompt, tool block or earlier turn
is tokenized once; the first requests are checked against a whole-text encode and the cache turns itself off
if a tokenizer ever disagrees. Block digests are memoized by (parent, block tokens) for the same reason.

`tokenizers` and `jinja2` are imported only when a RequestBlocks is built.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from app.kvcache.hashing import HashAlgo, block_digests, chain_digest, to_event_hash

_SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


class ChatRenderError(ValueError):
    """The body cannot be rendered with this chat template (the caller routes without exact hashes)."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def load_chat_template(folder: Path, config: Mapping[str, Any]) -> str:
    """The default chat template of an HF model folder (chat_template.jinja, else tokenizer_config.json)."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    tpl = config.get("chat_template")
    if isinstance(tpl, str):
        return tpl
    if isinstance(tpl, list):
        for item in tpl:
            if isinstance(item, dict) and item.get("name") == "default" and isinstance(item.get("template"), str):
                return str(item["template"])
    raise FileNotFoundError(f"no chat template in {folder}")


def _compile(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


def _text_content(content: Any) -> Any:
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            else:
                raise ChatRenderError("non-text content parts (images, audio, files) cannot be hashed in the gateway")
        return "\n".join(parts)
    return content


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to a string-content template."""
    out: list[dict[str, Any]] = []
    for m in messages:
        msg = dict(m)
        if msg.get("role") == "developer":  # vLLM (like OpenAI) treats developer messages as system ones
            msg["role"] = "system"
        if "content" in msg:
            msg["content"] = _text_content(msg["content"])
        calls = msg.get("tool_calls")
        if msg.get("role") == "assistant" and isinstance(calls, list):
            if not calls:
                msg.pop("tool_calls")
            else:
                fixed = []
                for call in calls:
                    call = dict(call)
                    fn = dict(call.get("function") or {})
                    args = fn.get("arguments")
                    if isinstance(args, str):
                        try:
                            fn["arguments"] = json.loads(args) if args else {}
                        except json.JSONDecodeError:
                            fn["arguments"] = {}
                    elif not args:
                        fn["arguments"] = {}
                    call["function"] = fn
                    fixed.append(call)
                msg["tool_calls"] = fixed
        out.append(msg)
    return out


class _Lru(OrderedDict[Any, Any]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        if len(self) > self.capacity:
            self.popitem(last=False)


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A request's prompt length in tokens and its block hashes (ints, as vLLM's KV events publish them)."""

    n_tokens: int
    hashes: list[int]


class RequestBlocks:
    """Block hashes for chat bodies, for one model folder, block size, hash algorithm and seed."""

    VERIFY_FIRST = 32

    def __init__(
        self,
        folder: str | Path,
        block_size: int,
        algo: HashAlgo = "sha256_cbor",
        *,
        piece_cache: int = 4096,
        digest_cache: int = 65_536,
    ) -> None:
        from tokenizers import Tokenizer

        self.folder = Path(folder).expanduser()
        self.block_size = block_size
        self.algo: HashAlgo = algo
        config_path = self.folder / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self._tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self._template = _compile(load_chat_template(self.folder, config))
        self._special = {k: t for k in _SPECIAL_KEYS if (t := _token_text(config.get(k))) is not None}
        specials = [t.content for t in self._tokenizer.get_added_tokens_decoder().values() if t.special]
        # Added tokens that strip neighbouring whitespace make pieces depend on each other: no piece cache.
        stripping = any(t.lstrip or t.rstrip for t in self._tokenizer.get_added_tokens_decoder().values())
        self._split = (
            re.compile("(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")")
            if specials and not stripping
            else None
        )
        self._pieces: _Lru = _Lru(piece_cache)
        self._digests: _Lru = _Lru(digest_cache)
        self._verify_left = self.VERIFY_FIRST
        self.piece_cache_disabled = self._split is None

    def render(self, body: Mapping[str, Any]) -> str:
        """The prompt text vLLM renders for a chat/completions body."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ChatRenderError("messages must be a non-empty list")
        kwargs: dict[str, Any] = dict(self._special)
        extra = body.get("chat_template_kwargs")
        if isinstance(extra, dict):
            kwargs.update(extra)
        kwargs["add_generation_prompt"] = body.get("add_generation_prompt", True)
        kwargs["continue_final_message"] = body.get("continue_final_message", False)
        msgs = template_messages(messages)
        try:
            text = str(self._template.render(messages=msgs, tools=body.get("tools"), **kwargs))
        except Exception as exc:  # a template error or a body the template cannot digest
            raise ChatRenderError(f"chat template failed: {type(exc).__name__}") from exc
        if kwargs["continue_final_message"]:
            # transformers cuts the render right after the final message's text, so the reply continues it.
            final = msgs[-1].get("content")
            final = final.strip() if isinstance(final, str) else ""
            if not final or final not in text:
                raise ChatRenderError("continue_final_message: final message not found in the render")
            text = text[: text.rindex(final) + len(final)]
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text, without added special tokens, reusing cached pieces."""
        if self._split is None or self.piece_cache_disabled:
            return list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        ids: list[int] = []
        pieces = self._pieces
        for piece in self._split.split(text):
            if not piece:
                continue
            cached = pieces.get(piece)
            if cached is None:
                cached = tuple(self._tokenizer.encode(piece, add_special_tokens=False).ids)
                pieces.put(piece, cached)
            else:
                pieces.move_to_end(piece)
            ids.extend(cached)
        if self._verify_left > 0:
            self._verify_left -= 1
            if ids != self._tokenizer.encode(text, add_special_tokens=False).ids:
                self.piece_cache_disabled = True
                return list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        return ids

    def token_ids(self, body: Mapping[str, Any]) -> list[int]:
        """Prompt token ids for a chat body."""
        return self.encode(self.render(body))

    def hashes_for_tokens(self, ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """Block hashes of token ids (memoized per block: shared prefixes are hashed once)."""
        bs = self.block_size
        out: list[int] = []
        memo = self._digests
        parent = b""
        for i in range(len(ids) // bs):
            block = tuple(ids[i * bs : (i + 1) * bs])
            key = (parent, block, cache_salt if i == 0 else None)
            digest = memo.get(key)
            if digest is None:
                if i == 0:
                    digest = block_digests(block, bs, cache_salt, self.algo)[0]
                else:
                    digest = chain_digest(parent, block, self.algo)
                memo.put(key, digest)
            out.append(to_event_hash(digest))
            parent = digest
        return out

    def blocks(self, body: Mapping[str, Any], cache_salt: str | None = None) -> PromptBlocks:
        """Prompt length and block hashes for a chat body; `cache_salt` defaults to the body's own."""
        salt = cache_salt if cache_salt is not None else body.get("cache_salt")
        ids = self.token_ids(body)
        return PromptBlocks(len(ids), self.hashes_for_tokens(ids, salt if isinstance(salt, str) else None))
