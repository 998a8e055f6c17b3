"""What a replica publishes about its engine is read, not configured: speculation, block size, slots, refusals."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.config import parse_config
from app.routing.engine_info import EngineInfo, from_metrics, from_models, from_version, info_labels
from app.routing.engine_read import EngineReader
from app.routing.state import ClusterState
from app.sim.testing import running_sim
from tests.conftest import running_gateway
from tests.routing.factory import PRICE

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_real_vllm_cpu_ngram_scrape_says_it_speculates_with_three_tokens_in_128_token_blocks() -> None:
    info = from_metrics((FIXTURES / "vllm_0_32_fast_metrics.txt").read_text())
    assert info.speculative is True and info.spec_tokens == 3
    assert (info.block_size, info.hash_algo, info.prefix_caching, info.num_gpu_blocks) == (128, "sha256", True, 182)
    assert info.max_num_seqs is None  # vLLM 0.32 publishes it nowhere outside dev mode


def test_a_real_vllm_cpu_scrape_without_spec_decode_series_says_it_does_not_speculate() -> None:
    info = from_metrics((FIXTURES / "vllm_0_32_bulk_metrics.txt").read_text())
    assert info.speculative is False and info.block_size == 128
    assert info.unsupported_params() == ()


def test_a_scrape_with_no_vllm_series_says_nothing_about_speculation() -> None:
    assert from_metrics("# nothing here\npython_info 1\n").speculative is None


def test_info_labels_reads_quoted_values_with_escapes() -> None:
    text = 'x 1\nvllm:cache_config_info{a="1",b="x \\"y\\", z",engine="0"} 1.0\n'
    assert info_labels(text, "vllm:cache_config_info{") == {"a": "1", "b": 'x "y", z', "engine": "0"}
    assert info_labels(text, "vllm:other_info{") is None


def test_a_speculating_engine_refuses_min_p_and_logit_bias() -> None:
    info = EngineInfo(speculative=True).merged(from_version({"version": "0.32.0"}))
    assert info.unsupported_params() == ("min_p", "logit_bias") and info.version == "0.32.0"
    assert EngineInfo(speculative=False).unsupported_params() == EngineInfo().unsupported_params() == ()


def test_models_body_gives_max_model_len_of_the_served_model_only() -> None:
    body = {"data": [{"id": "other", "max_model_len": 9}, {"id": "m", "max_model_len": 2048}]}
    assert from_models(body, "m").max_model_len == 2048
    assert from_models({"data": "junk"}, "m") == EngineInfo()


def test_merged_keeps_what_the_newer_read_does_not_say() -> None:
    old = EngineInfo(block_size=16, max_model_len=4096)
    assert old.merged(EngineInfo(block_size=128)) == EngineInfo(block_size=128, max_model_len=4096)


def _cfg(fast: dict[str, Any], replicas: tuple[str, str] = ("http://127.0.0.1:9", "http://127.0.0.1:10")) -> Any:
    return parse_config({
        "models": [{"name": "m", "pools": ["fast", "bulk"]}],
        "pools": {"fast": {"role": "interactive", "served_model": "s", "replicas": [replicas[0]], "price": PRICE,
                           **fast},
                  "bulk": {"role": "bulk", "served_model": "s", "replicas": [replicas[1]], "price": PRICE}},
        "auth": {"required": False}, "routing": {"allow_spill": False, "probe_interval_s": 0.2},
    })  # fmt: skip


def test_published_speculation_and_slots_apply_where_the_config_is_silent() -> None:
    cluster = ClusterState.from_config(_cfg({}))
    reader = EngineReader(cluster)
    fast = cluster.pools["fast"]
    reader.on_metrics(fast.replicas[0], (FIXTURES / "vllm_0_32_fast_metrics.txt").read_text())
    assert fast.unsupported_params == ("min_p", "logit_bias")
    reader._update(fast.replicas[0], EngineInfo(max_num_seqs=16))
    assert fast.replicas[0].capacity == 16
    rebuilt = ClusterState.from_config(_cfg({}), cluster)  # discovery rebuilds: what was read survives
    assert rebuilt.pools["fast"].unsupported_params == ("min_p", "logit_bias")
    assert rebuilt.pools["fast"].replicas[0].capacity == 16


def test_the_config_overrides_what_replicas_publish_and_a_contradiction_is_noted_once() -> None:
    cluster = ClusterState.from_config(_cfg({"speculative": False, "max_num_seqs": 8}))
    reader = EngineReader(cluster)
    fast = cluster.pools["fast"]
    for _ in range(3):
        reader.on_metrics(fast.replicas[0], (FIXTURES / "vllm_0_32_fast_metrics.txt").read_text())
        reader._update(fast.replicas[0], EngineInfo(max_num_seqs=16))
    assert fast.unsupported_params == () and fast.replicas[0].capacity == 8
    assert reader.disagreements.counts() == {("fast", "speculative"): 1, ("fast", "max_num_seqs"): 1}


def test_configured_unsupported_params_add_to_what_the_engine_implies() -> None:
    # config/local.yaml's fast pool: top_k crashes vLLM-CPU's ngram path, which nothing published tells.
    cluster = ClusterState.from_config(_cfg({"unsupported_params": ["top_k"]}))
    fast = cluster.pools["fast"]
    assert fast.unsupported_params == ("top_k",)
    EngineReader(cluster).on_metrics(fast.replicas[0], (FIXTURES / "vllm_0_32_fast_metrics.txt").read_text())
    assert fast.unsupported_params == ("top_k", "min_p", "logit_bias")


# -- through the gateway, against sims: the only marking of the speculative pool is what its engine publishes


@pytest.fixture
def unmarked_pools() -> Iterator[str]:
    with running_sim(model="s", speculative="ngram:3:0.6") as fast, running_sim(model="s") as bulk, \
            running_gateway(_cfg({}, (fast, bulk))) as gw:  # fmt: skip
        _wait_for(gw, 'gateway_engine_speculative{pool="fast"')
        yield gw


def _wait_for(gw: str, needle: str) -> None:
    # The scraper's first rounds (probe interval 0.2 s) have to read the sims' /metrics; bounded.
    deadline = time.monotonic() + 10
    while needle not in httpx.get(gw + "/metrics", timeout=5).text:
        assert time.monotonic() < deadline, f"{needle} never appeared on the gateway's /metrics"
        time.sleep(0.05)


def test_min_p_to_a_pool_that_only_publishes_its_speculation_is_served_by_the_other_pool(unmarked_pools: str) -> None:
    client = openai.OpenAI(base_url=unmarked_pools + "/v1", api_key="EMPTY", max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    plain = client.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=4)
    assert plain.headers["x-kvgate-route"].startswith("pool=fast;")
    raw = client.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=4,
                                                           extra_body={"min_p": 0.1})  # fmt: skip
    route = raw.headers["x-kvgate-route"]
    assert route.startswith("pool=bulk;") and "pick=capability:min_p" in route
    assert raw.parse().choices[0].message.content is not None


def test_a_speculating_sim_refuses_min_p_as_vllm_does() -> None:
    with running_sim(model="s", speculative="ngram:3:0.6") as fast:
        r = httpx.post(fast + "/v1/chat/completions", json={"model": "s", "max_tokens": 2, "min_p": 0.1,
                                                             "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "speculative decoding" in r.json()["error"]["message"]
