"""Recently hashed prompt prefixes, so a conversation's next turn reuses its earlier turns' token ids and digests.

A prefix is rendered text that ends at a special token, with the digests of its full blocks and the token
ids after them. Because HF tokenizers never merge across special tokens, any prompt whose text *starts with* that
text has the same ids there: one C-speed `str.startswith` replaces the split, the piece lookups and one memo
lookup per block. Reuse therefore never changes a result, only skips work; the caller's salt is part of the
key because it changes every digest.

Prefixes are grouped by (salt, text head) so a lookup compares only the few that can match; a new prefix
drops the ones it extends (the same conversation's earlier turns). Bounded by entries, least recently used
group first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prefix:
    """Rendered text ending at a special token: its full blocks' digests and event hashes, and the token ids
    after the last full block (all a continuation needs: its blocks start there)."""

    text: str
    tail: tuple[int, ...]
    digests: list[bytes]
    hashes: list[int]


class PrefixCache:
    """The cached prefix a rendered prompt starts with; not thread-safe (one event loop owns it)."""

    def __init__(self, capacity: int = 512, per_group: int = 8, head_chars: int = 256) -> None:
        if capacity <= 0 or per_group <= 0 or head_chars <= 0:
            raise ValueError("capacity, per_group and head_chars must be positive")
        self.capacity = capacity
        self.per_group = per_group
        self.head_chars = head_chars
        self._groups: OrderedDict[tuple[str | None, str], list[Prefix]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def longest(self, text: str, salt: str | None) -> Prefix | None:
        """The most recent (in practice the longest) cached prefix of `text` for this salt, or None."""
        if len(text) < self.head_chars:
            return None
        key = (salt, text[: self.head_chars])
        group = self._groups.get(key)
        if group is None:
            return None
        # Most recent first: a conversation's latest turn is the usual match. Two matches are prefixes of one
        # another and `put` drops the one extended, so the first is the longest unless an older turn was
        # re-sent after a newer one (then a shorter prefix is reused: fewer blocks skipped, same hashes).
        for p in group:
            if text.startswith(p.text):
                self._groups.move_to_end(key)
                return p
        return None

    def put(self, salt: str | None, prefix: Prefix) -> None:
        """Remember a prefix (too short to key: ignored); prefixes it extends are dropped."""
        text = prefix.text
        if len(text) < self.head_chars:
            return
        key = (salt, text[: self.head_chars])
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = []
        else:
            self._groups.move_to_end(key)
            kept = [p for p in group if not text.startswith(p.text)]
            self._size -= len(group) - len(kept)
            group[:] = kept
        group.insert(0, prefix)
        self._size += 1
        if len(group) > self.per_group:
            group.pop()
            self._size -= 1
        while self._size > self.capacity:
            oldest_key, oldest = next(iter(self._groups.items()))
            oldest.pop()
            self._size -= 1
            if not oldest:
                del self._groups[oldest_key]
