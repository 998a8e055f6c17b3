"""Stable 64-bit hashing: every gateway process must map the same key to the same replica."""

from __future__ import annotations

from hashlib import blake2b

MASK64 = (1 << 64) - 1


def stable_hash64(data: bytes) -> int:
    """A 64-bit hash that is the same in every process (unlike the salted builtin `hash`)."""
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


def mix64(x: int) -> int:
    """SplitMix64's finalizer: a cheap, well-spread bijection on 64-bit ints (rendezvous scores)."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)
