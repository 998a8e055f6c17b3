"""The sim answers like a vLLM 0.32 replica: OpenAI SDK streaming, usage, errors, metrics, aborts."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.sim.testing import running_sim

MODEL = "sim-model"
MSGS = [{"role": "system", "content": "You are a terse assistant. " * 20}, {"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with running_sim(model=MODEL, time_scale=50.0, profile="h100-8b", speculative="ngram:3:0.6") as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def _samples(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(base + "/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name")))
            out[(s.name, labels)] = s.value
    return out


def test_streaming_with_include_usage_through_the_openai_sdk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=40, stream=True, stream_options={"include_usage": True},
        seed=3, extra_body={"ignore_eos": True}, extra_headers={"X-Request-Id": "req-42"},
    ))
    assert {c.id for c in chunks} == {"chatcmpl-req-42"}
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    *content, last = chunks
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 40
    assert [c.choices[0].finish_reason for c in content if c.choices[0].finish_reason] == ["length"]
    streamed = "".join(c.choices[0].delta.content or "" for c in content)
    whole = client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=40, seed=3, extra_body={"ignore_eos": True}
    )
    assert whole.choices[0].message.content == streamed
    assert whole.usage is not None and whole.usage.prompt_tokens == last.usage.prompt_tokens


def test_x_request_id_is_echoed_and_names_the_completion(base: str) -> None:
    r = httpx.post(base + "/v1/chat/completions", headers={"X-Request-Id": "abc"},
                   json={"model": MODEL, "messages": MSGS, "max_tokens": 2})
    assert r.headers["x-request-id"] == "abc"
    assert r.json()["id"] == "chatcmpl-abc"


def test_output_is_deterministic_per_seed_and_differs_across_seeds(client: openai.OpenAI) -> None:
    def text(seed: int) -> str:
        r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=24, seed=seed,
                                           extra_body={"ignore_eos": True})
        return r.choices[0].message.content or ""

    assert text(11) == text(11)
    assert text(11) != text(12)


def test_a_seeded_request_continuing_its_own_opening_goes_on_after_it(client: openai.OpenAI, base: str) -> None:
    def chat(messages: list[dict[str, str]], n: int, **extra: object) -> str:
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, seed=5,  # type: ignore[arg-type]
                                           extra_body={"ignore_eos": True, **extra})
        return r.choices[0].message.content or ""

    whole = chat(MSGS, 30)
    opening = chat(MSGS, 12)
    open_turn = [*MSGS, {"role": "assistant", "content": opening}]
    rest = chat(open_turn, 18, continue_final_message=True, add_generation_prompt=False)
    assert opening + rest == whole  # a deterministic model continues its own text (what migration relies on)
    r = httpx.post(base + "/v1/responses", json={
        "model": MODEL, "max_output_tokens": 18, "seed": 5, "ignore_eos": True,
        "input": [*MSGS, {"type": "message", "role": "assistant", "status": "in_progress", "id": "msg_1",
                          "content": [{"type": "output_text", "text": opening, "annotations": []}]}],
    })
    assert opening + r.json()["output"][0]["content"][0]["text"] == whole  # vLLM's in-progress item continues


def test_ignore_eos_gives_exactly_max_tokens(client: openai.OpenAI) -> None:
    for n in (1, 17, 300):
        r = client.completions.create(model=MODEL, prompt="count with me", max_tokens=n,
                                      extra_body={"ignore_eos": True})
        assert r.usage is not None and r.usage.completion_tokens == n
        assert r.choices[0].finish_reason == "length"


def test_n_returns_that_many_choices_and_counts_all_their_tokens(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=8, n=3, seed=1,
                                       extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage is not None and r.usage.completion_tokens == 24
    assert len({c.message.content for c in r.choices}) == 3


@pytest.mark.parametrize(
    ("salt", "message"),
    [
        ("", "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)"),
        (5, "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)"),
        ("x" * 129, "Parameter 'cache_salt' must be at most 128 characters and must not contain "
                    "'@', '/', '\\\\', or NUL. (parameter=cache_salt)"),
        ("a/b", "Parameter 'cache_salt' must be at most 128 characters and must not contain "
                "'@', '/', '\\\\', or NUL. (parameter=cache_salt)"),
        ("a@b", "Parameter 'cache_salt' must be at most 128 characters and must not contain "
                "'@', '/', '\\\\', or NUL. (parameter=cache_salt)"),
        ("nul\x00", "Parameter 'cache_salt' must be at most 128 characters and must not contain "
                    "'@', '/', '\\\\', or NUL. (parameter=cache_salt)"),
    ],
)
def test_invalid_cache_salt_is_rejected_with_vllms_body(base: str, salt: object, message: str) -> None:
    r = httpx.post(base + "/v1/chat/completions",
                   json={"model": MODEL, "messages": MSGS, "max_tokens": 2, "cache_salt": salt})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": message, "type": "BadRequestError", "param": "cache_salt", "code": 400}}


def test_cached_tokens_are_reported_and_a_salt_isolates_the_cache(client: openai.OpenAI) -> None:
    msgs = [{"role": "system", "content": "Unique preamble for the salt test. " * 30}, {"role": "user", "content": "q"}]

    def cached(salt: str | None) -> int:
        extra: dict[str, object] = {"ignore_eos": True}
        if salt:
            extra["cache_salt"] = salt
        r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, extra_body=extra)
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.usage.prompt_tokens_details.cached_tokens or 0

    assert cached(None) == 0
    again = cached(None)
    assert again > 0 and again % 16 == 0
    assert cached("tenant-a") == 0
    assert cached("tenant-a") == again


def test_unknown_model_is_404_as_vllm_says_it(base: str) -> None:
    r = httpx.post(base + "/v1/chat/completions", json={"model": "nope", "messages": MSGS})
    assert r.status_code == 404
    assert r.json()["error"] == {"message": f"The model `nope` does not exist. Valid aliases: {MODEL}.",
                                 "type": "NotFoundError", "param": "model", "code": 404}


def test_max_tokens_beyond_the_model_length_is_400(base: str) -> None:
    r = httpx.post(base + "/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "max_tokens": 10**7})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_tokenize_returns_the_ids_the_engine_counts(base: str, client: openai.OpenAI) -> None:
    tok = httpx.post(base + "/tokenize", json={"model": MODEL, "messages": MSGS}).json()
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=1)
    assert r.usage is not None and tok["count"] == r.usage.prompt_tokens == len(tok["tokens"])


def test_models_health_and_version(base: str) -> None:
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/v1/models").json()["data"][0]["id"] == MODEL
    assert httpx.get(base + "/version").json() == {"version": "0.32.0"}


def test_metrics_use_vllm_names_and_spec_counters_add_up(base: str, client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=64, extra_body={"ignore_eos": True})
    m = _samples(base)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count",
                 "vllm:request_time_per_output_token_seconds_count"):
        assert (name, ()) in m, name
    assert m[("vllm:request_success_total", (("finished_reason", "length"),))] >= 1
    drafts = m[("vllm:spec_decode_num_drafts_total", ())]
    accepted = m[("vllm:spec_decode_num_accepted_tokens_total", ())]
    per_pos = [m[("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(p)),))] for p in range(3)]
    assert drafts > 0 and sum(per_pos) == accepted
    assert m[("vllm:spec_decode_num_draft_tokens_total", ())] <= 3 * drafts
    assert m[("vllm:prefix_cache_hits_total", ())] <= m[("vllm:prefix_cache_queries_total", ())]


def test_client_disconnect_aborts_the_request_and_frees_its_blocks() -> None:
    with running_sim(model=MODEL, time_scale=1.0, profile="cpu-smollm2") as url:
        body = {"model": MODEL, "messages": MSGS, "max_tokens": 1000, "stream": True, "ignore_eos": True}
        with httpx.Client(timeout=10) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            while not next(lines).startswith("data: {"):
                pass
            m = _samples(url)
            assert m[("vllm:num_requests_running", ())] == 1
            assert m[("vllm:kv_cache_usage_perc", ())] > 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            m = _samples(url)
            if m[("vllm:num_requests_running", ())] == 0:
                break
            time.sleep(0.05)
        assert m[("vllm:num_requests_running", ())] == 0
        assert m[("vllm:kv_cache_usage_perc", ())] == 0
        assert m[("vllm:request_success_total", (("finished_reason", "abort"),))] == 1
