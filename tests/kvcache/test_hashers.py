"""The kv_events hasher hashes at the block size and algorithm the replicas publish; config only overrides."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from app.config import GatewayConfig, parse_config
from app.kvcache.hashers import BlockHashers
from app.kvcache.hashing import block_hashes
from app.kvcache.subscriber import KvEventsHub
from app.kvcache.tokens import RequestBlocks
from app.routing.engine_info import EngineInfo
from app.routing.state import ClusterState
from tests.routing.factory import PRICE

URLS = ("http://127.0.0.1:9101", "http://127.0.0.1:9102")
WORDS = ["hello", "world", "fix", "the", "bug", "please", "now", "again"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny HF-like folder: a word-level tokenizer and a ChatML template (no model download needed)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    path = tmp_path_factory.mktemp("tok")
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate([*WORDS, "user", "assistant", "system"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tok.save(str(path / "tokenizer.json"))
    template = "{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|> {% endfor %}"
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return path


def _cfg(folder: Path, policy: dict[str, Any] | None = None) -> GatewayConfig:
    replicas = [{"url": u, "kv_events": f"tcp://127.0.0.1:{5600 + i}"} for i, u in enumerate(URLS)]
    pool: dict[str, Any] = {"role": "bulk", "served_model": "s", "replicas": replicas, "price": PRICE,
                            "tokenizer": str(folder)}  # fmt: skip
    if policy is not None:
        pool["policy"] = {"type": "kv_events", **policy}
    return parse_config({"models": [{"name": "m", "pools": ["p"]}], "pools": {"p": pool}})


def _setup(cfg: GatewayConfig) -> tuple[BlockHashers, KvEventsHub, ClusterState]:
    hub = KvEventsHub([(u, f"tcp://127.0.0.1:{5600 + i}", None) for i, u in enumerate(URLS)])  # never started
    cluster = ClusterState.from_config(cfg, kv_hub=hub)
    return BlockHashers(cfg, hub, lambda: cluster), hub, cluster


BODY = {"messages": [{"role": "user", "content": " ".join(WORDS * 40)}]}


def test_without_a_block_size_in_config_the_published_one_is_used(folder: Path) -> None:
    hashers, hub, cluster = _setup(_cfg(folder))
    assert hashers.get("m") is None  # nothing published yet: no hashes (the index is empty as well)
    hub.stats(URLS[0]).block_size = 32  # its BlockStored events said so
    cluster.pools["p"].replicas[1].engine = EngineInfo(block_size=32, hash_algo="sha256")  # its /metrics
    hasher = hashers.get("m")
    assert hasher is not None and (hasher.block_size, hasher.algo) == (32, "sha256")
    blocks = hasher.blocks(BODY)
    assert blocks.block_size == 32
    plain = RequestBlocks(folder, 32, "sha256")
    assert blocks.hashes == block_hashes(plain.token_ids(BODY), 32, algo="sha256")
    assert hashers.get("m") is hasher  # one variant per (folder, size, algorithm)


def test_events_win_over_metrics_for_the_same_replica(folder: Path) -> None:
    hashers, hub, cluster = _setup(_cfg(folder))
    for r in cluster.pools["p"].replicas:
        r.engine = EngineInfo(block_size=16)
        hub.stats(r.url).block_size = 128
    got = hashers.get("m")
    assert got is not None and got.block_size == 128


def test_a_configured_block_size_overrides_and_a_contradiction_is_counted_once(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hashers, hub, _ = _setup(_cfg(folder, {"block_size": 16}))
    hub.stats(URLS[0]).block_size = 128
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            got = hashers.get("m")
            assert got is not None and got.block_size == 16
    assert hashers.disagreements.counts() == {("p", "block_size"): 1}
    assert sum("block_size=16" in r.getMessage() for r in caplog.records) == 1


def test_replicas_with_different_block_sizes_are_refused_with_one_clear_error(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hashers, hub, _ = _setup(_cfg(folder))
    hub.stats(URLS[0]).block_size = 16
    hub.stats(URLS[1]).block_size = 128
    with caplog.at_level(logging.ERROR):
        assert hashers.get("m") is None and hashers.get("m") is None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "16: " + URLS[0] in errors[0] and "128: " + URLS[1] in errors[0]
    hub.stats(URLS[0]).block_size = 128  # the operator fixed it: hashing resumes
    got = hashers.get("m")
    assert got is not None and got.block_size == 128


def test_an_algorithm_kvgate_cannot_reproduce_is_refused(folder: Path) -> None:
    hashers, hub, cluster = _setup(_cfg(folder))
    hub.stats(URLS[0]).block_size = 16
    cluster.pools["p"].replicas[0].engine = EngineInfo(hash_algo="xxhash")
    assert hashers.get("m") is None
