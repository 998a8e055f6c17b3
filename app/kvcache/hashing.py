"""vLLM 0.32's prefix-cache block hashes, computed in the gateway from token ids.

vLLM (vllm/v1/core/kv_cache_utils.py) hashes each *full* block of `block_size` tokens as
``hash_fn((parent_hash, tuple(block_tokens), extra_keys))``, chained from ``NONE_HASH = hash_fn(seed)``.
Its KV events publish each hash as the low 64 bits of the digest (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1,
the default), which is what `block_hashes` returns.

Algorithms (`--prefix-caching-hash-algo`):
- ``sha256`` (vLLM's default): SHA-256 of a pickle (protocol 5). The seed is the fixed string
  "vllm-none-hash" unless PYTHONHASHSEED is set, so it *is* reproducible across processes, but only by a
  Python that pickles the same way.
- ``sha256_cbor``: SHA-256 of canonical CBOR; language-independent. What kvgate recommends.
- ``xxhash`` / ``xxhash_cbor``: seeded with per-process random bytes unless PYTHONHASHSEED is set, so
  not reproducible outside the engine; not supported here.

Extra keys: LoRA ``("lora", name, path)`` on every block, then ``("cache_salt", salt)`` on block 0 only.
Multimodal and prompt-embeds keys need the engine's processed inputs: such requests cannot be predicted.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, Final, Literal

HashAlgo = Literal["sha256", "sha256_cbor"]

NONE_HASH_SEED: Final = "vllm-none-hash"
_MASK64: Final = (1 << 64) - 1
_TABLE_SIZE: Final = 1 << 16


def _cbor_head(major: int, n: int) -> bytes:
    """CBOR initial byte(s) for major type `major` and argument `n`, shortest form (canonical)."""
    m = major << 5
    if n < 24:
        return bytes((m | n,))
    if n < 0x100:
        return bytes((m | 24, n))
    if n < 0x10000:
        return bytes((m | 25,)) + n.to_bytes(2, "big")
    if n < 0x100000000:
        return bytes((m | 26,)) + n.to_bytes(4, "big")
    return bytes((m | 27,)) + n.to_bytes(8, "big")


def _cbor_int(n: int) -> bytes:
    return _cbor_head(0, n) if n >= 0 else _cbor_head(1, -1 - n)


def cbor_encode(obj: Any) -> bytes:
    """Canonical CBOR for the value shapes vLLM hashes (None, bool, int, str, bytes, tuple/list)."""
    if obj is None:
        return b"\xf6"
    if obj is True:
        return b"\xf5"
    if obj is False:
        return b"\xf4"
    if isinstance(obj, int):
        return _cbor_int(obj)
    if isinstance(obj, bytes):
        return _cbor_head(2, len(obj)) + obj
    if isinstance(obj, str):
        raw = obj.encode("utf-8")
        return _cbor_head(3, len(raw)) + raw
    if isinstance(obj, tuple | list):
        return _cbor_head(4, len(obj)) + b"".join(cbor_encode(x) for x in obj)
    raise TypeError(f"cannot CBOR-encode {type(obj).__name__} as vLLM would")


# Immutable lookup for token ids below 2**16 (covers vocabularies up to 65k at C speed); larger ids take
# the per-token path. Built once at import: a tuple is constant, not shared mutable state.
_TOKEN_CBOR: Final[tuple[bytes, ...]] = tuple(_cbor_head(0, i) for i in range(_TABLE_SIZE))


def _cbor_tokens(tokens: Sequence[int]) -> bytes:
    head = _cbor_head(4, len(tokens))
    if len(tokens) < 2:  # itemgetter of one key returns the item, not a 1-tuple
        return head + b"".join(_cbor_int(t) for t in tokens)
    try:
        # itemgetter does the whole lookup in C: ~2x faster than map() or a comprehension.
        return head + b"".join(itemgetter(*tokens)(_TOKEN_CBOR))
    except (IndexError, TypeError):
        return head + b"".join(_cbor_int(t) for t in tokens)


def _sha256_cbor_block(parent: bytes, tokens: Sequence[int], extra: bytes) -> bytes:
    # A 3-array of (parent bytes, token array, extra keys); parent is always a 32-byte digest.
    return hashlib.sha256(b"\x83\x58\x20" + parent + _cbor_tokens(tokens) + extra).digest()


def _sha256_pickle_block(parent: bytes, tokens: Sequence[int], extra: Any) -> bytes:
    return hashlib.sha256(pickle.dumps((parent, tuple(tokens), extra), protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash(algo: HashAlgo = "sha256_cbor", seed: str = NONE_HASH_SEED) -> bytes:
    """The root parent hash vLLM chains the first block from (seed = PYTHONHASHSEED if the engine has one)."""
    if algo == "sha256_cbor":
        return hashlib.sha256(cbor_encode(seed)).digest()
    if algo == "sha256":
        return hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    raise ValueError(f"unsupported prefix-caching hash algorithm {algo!r} (use sha256_cbor or sha256)")


def _extra_keys(block_index: int, cache_salt: str | None, lora: tuple[str, str] | None) -> tuple[Any, ...] | None:
    keys: list[tuple[str, ...]] = []
    if lora is not None:
        keys.append(("lora", lora[0], lora[1]))
    if block_index == 0 and cache_salt:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def block_digests(
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None = None,
    algo: HashAlgo = "sha256_cbor",
    lora: tuple[str, str] | None = None,
    seed: str = NONE_HASH_SEED,
) -> list[bytes]:
    """Full 32-byte digests of every full block, exactly as vLLM's request block hasher computes them."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    block_fn: Callable[[bytes, Sequence[int], Any], bytes]
    if algo == "sha256_cbor":
        block_fn = _sha256_cbor_block
        encode_extra: Callable[[Any], Any] = cbor_encode
    elif algo == "sha256":
        block_fn = _sha256_pickle_block
        encode_extra = _identity
    else:
        raise ValueError(f"unsupported prefix-caching hash algorithm {algo!r} (use sha256_cbor or sha256)")
    parent = none_hash(algo, seed)
    # Block 0 may differ (salt); every later block shares one extra-keys value.
    extra_first = encode_extra(_extra_keys(0, cache_salt, lora))
    extra_rest = encode_extra(_extra_keys(1, cache_salt, lora))
    out: list[bytes] = []
    n_full = len(token_ids) // block_size
    for i in range(n_full):
        start = i * block_size
        parent = block_fn(parent, token_ids[start : start + block_size], extra_first if i == 0 else extra_rest)
        out.append(parent)
    return out


def _identity(value: Any) -> Any:
    return value


def chain_digest(parent: bytes, block: Sequence[int], algo: HashAlgo = "sha256_cbor") -> bytes:
    """The digest of one full block after `parent`, for blocks past the first without LoRA (no extra keys)."""
    if algo == "sha256_cbor":
        return _sha256_cbor_block(parent, block, b"\xf6")
    if algo == "sha256":
        return _sha256_pickle_block(parent, block, None)
    raise ValueError(f"unsupported prefix-caching hash algorithm {algo!r} (use sha256_cbor or sha256)")


def to_event_hash(digest: bytes) -> int:
    """The int vLLM publishes in KV events for a digest: its low 64 bits, big-endian."""
    return int.from_bytes(digest, "big") & _MASK64


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None = None,
    algo: HashAlgo = "sha256_cbor",
    lora: tuple[str, str] | None = None,
    seed: str = NONE_HASH_SEED,
) -> list[int]:
    """The request's block hashes as vLLM's KV events publish them (ints), one per full block, in order."""
    return [to_event_hash(d) for d in block_digests(token_ids, block_size, cache_salt, algo, lora, seed)]
