"""Block hashes equal vLLM 0.32's own (vectors from tests/kvcache/fixtures/make_vllm_vectors.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.kvcache.hashing import block_digests, block_hashes, cbor_encode, none_hash, to_event_hash

VECTORS = json.loads((Path(__file__).parent / "fixtures" / "vllm_vectors.json").read_text())
CASES = [(algo, c) for algo, v in VECTORS["algos"].items() for c in v["cases"]]


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_none_hash_matches_vllm_seeded_root(algo: str) -> None:
    assert none_hash(algo).hex() == VECTORS["algos"][algo]["none_hash_hex"]  # type: ignore[arg-type]


@pytest.mark.parametrize(("algo", "case"), CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(CASES)])
def test_block_digests_match_vllm_request_block_hasher(algo: str, case: dict) -> None:
    lora = tuple(case["lora"]) if case["lora"] else None
    got = block_digests(case["tokens"], case["block_size"], case["cache_salt"], algo, lora)  # type: ignore[arg-type]
    assert [d.hex() for d in got] == case["hashes_hex"]
    assert block_hashes(case["tokens"], case["block_size"], case["cache_salt"], algo, lora) == case["hashes_int"]  # type: ignore[arg-type]


def test_only_full_blocks_are_hashed() -> None:
    assert block_hashes(list(range(31)), 16) == block_hashes(list(range(16)), 16)
    assert block_hashes(list(range(15)), 16) == []


def test_salt_changes_every_block_through_the_chain() -> None:
    plain = block_hashes(list(range(64)), 16)
    salted = block_hashes(list(range(64)), 16, cache_salt="t1")
    assert all(a != b for a, b in zip(plain, salted, strict=True))


def test_event_hash_is_low_64_bits_of_digest() -> None:
    digest = bytes(range(32))
    assert to_event_hash(digest) == int.from_bytes(digest[24:], "big")


def test_cbor_encoding_uses_shortest_integer_forms() -> None:
    assert cbor_encode([23, 24, 255, 256, 65536, -1]) == bytes.fromhex("8617181818ff1901001a0001000020")


def test_unsupported_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="xxhash"):
        block_hashes([1] * 16, 16, algo="xxhash")  # type: ignore[arg-type]
