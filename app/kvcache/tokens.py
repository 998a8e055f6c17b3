"""Token ids of a chat request, the way vLLM 0.32 renders and tokenizes it, and its block hashes.

Rendering is transformers' apply_chat_template (app.kvcache.chat_template, what vLLM calls for HF models);
the template sees `messages`, `tools`, `add_generation_prompt` (True unless the body says otherwise),
`continue_final_message`, the tokenizer's special tokens, and the request's `chat_template_kwargs`.
Tokenization adds no special tokens (vLLM's chat default).

Hot path: a rendered prompt is split at the tokenizer's special tokens, which HF tokenizers never merge
across, and each piece's ids are cached (bounded LRU), so a stable system prompt, tool block or earlier turn
is tokenized once; the first requests are checked against a whole-text encode and the cache turns itself off
if a tokenizer ever disagrees. A prompt that starts with a recently hashed one up to one of its special
tokens (the conversation's earlier turn, app.kvcache.prefixes) takes that prefix's block digests whole;
the blocks after it are memoized by (parent, block tokens). `next_turn_text` lets a turn's work be done ahead
of it (app.kvcache.replies: after a response was sent, the next turn's prefix is hashed).

`tokenizers` and `jinja2` are imported only when a RequestBlocks is built.
"""

from __future__ import annotations

import copy
import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from app.kvcache.chat_template import ChatRenderError, compile_template, load_chat_template, template_messages
from app.kvcache.hashing import HashAlgo, block_digests, chain_digest, to_event_hash
from app.kvcache.prefixes import Prefix, PrefixCache
from app.records import PromptBlocks

_SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
# Stands in for the next turn's user message when a reply is learned: the render is cut before it.
_NEXT_USER: Final = "\x00kvgate-next-user-message\x00"


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class _Lru(OrderedDict[Any, Any]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        if len(self) > self.capacity:
            self.popitem(last=False)


def effective_salt(body: Mapping[str, Any], cache_salt: str | None) -> str | None:
    """The salt vLLM hashes the first block with: the gateway's, else the body's own `cache_salt`."""
    salt = cache_salt if cache_salt is not None else body.get("cache_salt")
    return salt if isinstance(salt, str) else None


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
        prefix_cache: int = 512,
    ) -> None:
        from tokenizers import Tokenizer

        self.folder = Path(folder).expanduser()
        self.block_size = block_size
        self.algo: HashAlgo = algo
        config_path = self.folder / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self._tokenizer = tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        # tokenizers >= 0.20 can skip computing offsets (a quarter of a short piece's encode); same ids.
        self._encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
        self._template = compile_template(load_chat_template(self.folder, config))
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
        self._prefixes = PrefixCache(prefix_cache)
        # A special token inside another could match across a prefix's end: then no prefix is reused.
        self._nested = any(a != b and a in b for a in specials for b in specials)
        self._verify_left = self.VERIFY_FIRST
        self.piece_cache_disabled = self._split is None
        self.prefix_hits = 0

    def variant(self, block_size: int, algo: HashAlgo) -> RequestBlocks:
        """The same tokenizer and template hashing in blocks of `block_size` with `algo`: shares the tokenizer,
        the template and the piece cache (token ids do not depend on blocks), so it costs no file read."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        other = copy.copy(self)
        other.block_size = block_size
        other.algo = algo
        other._digests = _Lru(self._digests.capacity)
        other._prefixes = PrefixCache(self._prefixes.capacity)
        other.prefix_hits = 0
        return other

    @property
    def reuses_prefixes(self) -> bool:
        """Whether prompts reuse cached prefixes (and learned replies can pay off)."""
        return not self.piece_cache_disabled and not self._nested

    def render(self, body: Mapping[str, Any]) -> str:
        """The prompt text vLLM renders for a chat/completions body."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ChatRenderError("messages must be a non-empty list")
        return self._render(
            body, messages, body.get("add_generation_prompt", True), body.get("continue_final_message", False)
        )

    def _render(
        self, body: Mapping[str, Any], messages: list[Any], add_generation_prompt: Any, continue_final: Any
    ) -> str:
        kwargs: dict[str, Any] = dict(self._special)
        extra = body.get("chat_template_kwargs")
        if isinstance(extra, dict):
            kwargs.update(extra)
        kwargs["add_generation_prompt"] = add_generation_prompt
        kwargs["continue_final_message"] = continue_final
        msgs = template_messages(messages)
        try:
            text = str(self._template.render(messages=msgs, tools=body.get("tools"), **kwargs))
        except Exception as exc:  # a template error or a body the template cannot digest
            raise ChatRenderError(f"chat template failed: {type(exc).__name__}") from exc
        if continue_final:
            # transformers cuts the render right after the final message's text, so the reply continues it.
            final = msgs[-1].get("content")
            final = final.strip() if isinstance(final, str) else ""
            if not final or final not in text:
                raise ChatRenderError("continue_final_message: final message not found in the render")
            text = text[: text.rindex(final) + len(final)]
        return text

    def next_turn_text(self, body: Mapping[str, Any], reply: Mapping[str, Any]) -> str:
        """The start of the next turn's render: this body's messages, then the assistant `reply`, up to the
        last special token before the next user message (what a client continuing the conversation sends)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or self._split is None:
            raise ChatRenderError("nothing to continue")
        turn = [*messages, dict(reply), {"role": "user", "content": _NEXT_USER}]
        text = self._render(body, turn, False, False)
        at = text.find(_NEXT_USER)
        if at < 0:
            raise ChatRenderError("the next user message is not in the render")
        head = text[:at]
        return head[: at - len(self._split.split(head)[-1])]

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text, without added special tokens, reusing cached pieces."""
        if self._split is None or self.piece_cache_disabled:
            return self._whole(text)
        ids: list[int] = []
        self._extend(ids, self._split.split(text))
        return self._verified(text, ids)

    def _whole(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _extend(self, ids: list[int], pieces: Sequence[str]) -> None:
        cache = self._pieces
        for piece in pieces:
            if not piece:
                continue
            cached = cache.get(piece)
            if cached is None:
                cached = tuple(self._encode_batch([piece], add_special_tokens=False)[0].ids)
                cache.put(piece, cached)
            else:
                cache.move_to_end(piece)
            ids.extend(cached)

    def _verified(self, text: str, ids: list[int]) -> list[int]:
        # The first requests check the piece-wise ids against a whole-text encode (off for good on a mismatch).
        if self._verify_left > 0:
            self._verify_left -= 1
            whole = self._whole(text)
            if ids != whole:
                self.piece_cache_disabled = True
                return whole
        return ids

    def unseen_pieces(self, text: str, cache_salt: str | None = None) -> list[str]:
        """Pieces of `text` past its longest cached prefix that the piece cache lacks (what encoding costs)."""
        if self._split is None or not self.reuses_prefixes:
            return []
        prefix = self._prefixes.longest(text, cache_salt)
        rest = text[len(prefix.text) :] if prefix is not None else text
        cache = self._pieces
        return list(dict.fromkeys(p for p in self._split.split(rest) if p and p not in cache))

    def encode_pieces(self, pieces: Sequence[str]) -> list[tuple[int, ...]]:
        """Token ids of each piece; touches only the tokenizer, whose batch encode releases the GIL (a thread
        may run it while the event loop serves requests)."""
        return [tuple(e.ids) for e in self._encode_batch(list(pieces), add_special_tokens=False)]

    def seed_pieces(self, pieces: Sequence[str], encoded: Sequence[tuple[int, ...]]) -> None:
        """Put pieces encoded elsewhere (encode_pieces) into the piece cache."""
        for piece, ids in zip(pieces, encoded, strict=True):
            self._pieces.put(piece, ids)

    def token_ids(self, body: Mapping[str, Any]) -> list[int]:
        """Prompt token ids for a chat body."""
        return self.encode(self.render(body))

    def hashes_for_tokens(self, ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """Block hashes of token ids (memoized per block: shared prefixes are hashed once)."""
        digests: list[bytes] = []
        hashes: list[int] = []
        self._chain(ids, digests, hashes, cache_salt)
        return hashes

    def _chain(
        self, ids: Sequence[int], digests: list[bytes], hashes: list[int], salt: str | None, memo: bool = True
    ) -> None:
        # Extends digests/hashes over the full blocks of `ids`, the tokens from the first block they lack.
        bs, algo = self.block_size, self.algo
        digest_memo = self._digests
        first = len(digests)
        parent = digests[-1] if digests else b""
        for j in range(len(ids) // bs):
            block = tuple(ids[j * bs : (j + 1) * bs])
            i = first + j
            key = (parent, block, salt if i == 0 else None) if memo else None
            digest = digest_memo.get(key) if key is not None else None
            if digest is None:
                digest = chain_digest(parent, block, algo) if i else block_digests(block, bs, salt, algo)[0]
                if key is not None:
                    digest_memo.put(key, digest)
            digests.append(digest)
            hashes.append(to_event_hash(digest))
            parent = digest

    def blocks_for_text(self, text: str, cache_salt: str | None = None) -> PromptBlocks:
        """Prompt length and block hashes of rendered text, from its longest cached prefix on; the text up to
        its last special token becomes a prefix for the prompts that continue it."""
        split = self._split
        if split is None or not self.reuses_prefixes:
            whole = self.encode(text)
            return PromptBlocks(len(whole), self.hashes_for_tokens(whole, cache_salt), self.block_size)
        bs = self.block_size
        prefix = self._prefixes.longest(text, cache_salt)
        # `ids` holds the tokens from the first block the digests lack: the prefix's tail, then the new text's.
        if prefix is None:
            start, ids, digests, hashes = 0, [], [], []
        else:
            start, ids, digests = len(prefix.text), list(prefix.tail), list(prefix.digests)
            hashes = list(prefix.hashes)
            self.prefix_hits += 1
        base = len(digests) * bs
        pieces = split.split(text[start:] if start else text)
        # re.split with one group ends with the text after the last special token: the prefix stops before it.
        self._extend(ids, pieces[:-1])
        cut, cut_ids = len(text) - len(pieces[-1]), len(ids)
        self._extend(ids, pieces[-1:])
        # Past a cached prefix the blocks are new text (the memo serves prompts that found none).
        self._chain(ids, digests, hashes, cache_salt, memo=prefix is None)
        if self._verify_left > 0:  # the first prompts check the result against a whole-text encode
            self._verify_left -= 1
            whole = self._whole(text)
            if whole[base:] != ids or self.hashes_for_tokens(whole, cache_salt) != hashes:
                self.piece_cache_disabled = True
                return PromptBlocks(len(whole), self.hashes_for_tokens(whole, cache_salt), self.block_size)
        out = PromptBlocks(base + len(ids), hashes, bs)
        if cut > start:
            full = (base + cut_ids) // bs
            del digests[full:]  # the prefix owns them from here on
            tail = tuple(ids[full * bs - base : cut_ids])
            self._prefixes.put(cache_salt, Prefix(text[:cut], tail, digests, hashes[:full]))
        return out

    def blocks(self, body: Mapping[str, Any], cache_salt: str | None = None) -> PromptBlocks:
        """Prompt length and block hashes for a chat body; `cache_salt` defaults to the body's own."""
        return self.blocks_for_text(self.render(body), effective_salt(body, cache_salt))
