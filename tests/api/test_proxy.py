"""The proxy core through the official openai SDK, over real sockets."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.conftest import PUBLIC_MODEL, gateway_config
from tests.servers import FakeUpstream, free_port


def client(base: str, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="EMPTY", max_retries=0, **kw)  # type: ignore[arg-type]


def test_chat_non_streaming_rewrites_model_and_returns_usage(gateway: str, fake_upstream) -> None:
    fake, _ = fake_upstream
    resp = client(gateway).chat.completions.with_raw_response.create(
        model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    completion = resp.parse()
    assert completion.model == PUBLIC_MODEL
    assert completion.choices[0].message.content == "Hello there, friend!"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert fake.seen[-1]["model"] == "served-model"
    assert resp.headers["x-request-id"]
    assert "pool=main" in resp.headers["x-kvgate-route"]
    assert float(resp.headers["x-kvgate-cost-usd"]) > 0


def test_stream_without_usage_hides_usage_chunk_but_asks_upstream(gateway: str, fake_upstream) -> None:
    fake, _ = fake_upstream
    chunks = list(
        client(gateway).chat.completions.create(
            model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there, friend!"
    assert all(c.usage is None for c in chunks)
    assert all(c.model == PUBLIC_MODEL for c in chunks)
    assert fake.seen[-1]["stream_options"] == {"include_usage": True}


def test_stream_with_usage_relays_usage_chunk(gateway: str) -> None:
    chunks = list(
        client(gateway).chat.completions.create(
            model=PUBLIC_MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 25


def test_stream_carries_cost_as_sse_comment(gateway: str) -> None:
    body = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    text = httpx.post(gateway + "/v1/chat/completions", json=body).text
    assert ": x-kvgate-cost-usd " in text
    assert text.endswith("data: [DONE]\n\n")


def test_async_client_completions(gateway: str) -> None:
    async def go() -> str:
        c = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key="EMPTY", max_retries=0)
        r = await c.completions.create(model=PUBLIC_MODEL, prompt="say hi")
        await c.close()
        return r.choices[0].text

    assert asyncio.run(go()) == "Hello there, friend!"


def test_embeddings_pass_through(gateway: str) -> None:
    r = client(gateway).embeddings.create(model=PUBLIC_MODEL, input="abc")
    assert r.data[0].embedding == [0.1, 0.2]
    assert r.model == PUBLIC_MODEL


def test_models_lists_public_names(gateway: str) -> None:
    assert [m.id for m in client(gateway).models.list()] == [PUBLIC_MODEL]


def test_request_id_is_forwarded_and_returned(gateway: str, fake_upstream) -> None:
    fake, _ = fake_upstream
    r = httpx.post(
        gateway + "/v1/chat/completions",
        json={"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "x"}]},
        headers={"x-request-id": "abc-123"},
    )
    assert r.headers["x-request-id"] == "abc-123"
    assert fake.seen_headers[-1]["x-request-id"] == "abc-123"
    assert r.json()["id"] == "chatcmpl-abc-123"


@pytest.mark.parametrize(
    ("payload", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1,2]", 400, None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
        (b'{"model": "public-model", "messages": []}', 400, "messages"),
        (b'{"model": "public-model", "messages": [{"role": "user"}], "max_tokens": -1}', 400, "max_tokens"),
        (b'{"model": "public-model", "messages": [{"role": "user"}], "stream": "yes"}', 400, "stream"),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ],
)
def test_bad_requests_get_openai_error_envelopes(gateway: str, payload: bytes, status: int, param: str) -> None:
    r = httpx.post(gateway + "/v1/chat/completions", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param
    assert err["message"]


def test_unknown_model_raises_not_found_in_sdk(gateway: str) -> None:
    with pytest.raises(openai.NotFoundError):
        client(gateway).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_body_over_limit_is_413(gateway: str) -> None:
    big = "x" * 70000
    r = httpx.post(gateway + "/v1/chat/completions",
                   json={"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": big}]})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_upstream_4xx_body_passes_through_unchanged(gateway: str) -> None:
    r = httpx.post(gateway + "/v1/chat/completions",
                   json={"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "mode:bad400"}]})
    assert r.status_code == 400
    assert r.json() == {"object": "error", "message": "max_tokens too large", "type": "BadRequestError",
                        "param": None, "code": 400}


def test_a_non_json_upstream_4xx_reaches_the_client_as_json_in_openais_envelope(gateway: str) -> None:
    r = httpx.post(gateway + "/v1/chat/completions",
                   json={"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "mode:text400"}]})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == "upstream_error" and "header too long" in err["message"]


def test_unreachable_upstream_before_any_probe_is_502(stack) -> None:
    cfg = gateway_config([f"http://127.0.0.1:{free_port()}"], routing={"probe_interval_s": 60})
    gw = stack(cfg)
    with pytest.raises(openai.APIStatusError) as info:
        client(gw).chat.completions.create(model=PUBLIC_MODEL, messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502


def test_replica_that_fails_probes_leaves_rotation_503_and_unready(stack) -> None:
    gw = stack(gateway_config([f"http://127.0.0.1:{free_port()}"]))
    deadline = time.monotonic() + 5
    while httpx.get(gw + "/ready").status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(gw + "/ready").status_code == 503
    with pytest.raises(openai.APIStatusError) as info:
        client(gw).chat.completions.create(model=PUBLIC_MODEL, messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 503
    assert info.value.body["code"] == "no_healthy_upstream"  # type: ignore[index]


def test_upstream_5xx_everywhere_is_502_after_retries(gateway: str, fake_upstream) -> None:
    fake, _ = fake_upstream
    before = len(fake.seen)
    r = httpx.post(gateway + "/v1/chat/completions",
                   json={"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "mode:fail500"}]})
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "upstream_error"
    assert len(fake.seen) - before >= 1


def test_upstream_read_timeout_is_504(gateway: str) -> None:
    r = httpx.post(gateway + "/v1/chat/completions", timeout=30,
                   json={"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "mode:hang"}]})
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"


def test_midstream_failure_ends_stream_with_error_event(gateway: str) -> None:
    body = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "mode:midstream"}], "stream": True}
    with httpx.stream("POST", gateway + "/v1/chat/completions", json=body, timeout=10) as r:
        text = "".join(r.iter_text())
    assert text.count("chat.completion.chunk") == 3
    assert '"error"' in text
    assert text.endswith("data: [DONE]\n\n")


def leave_mid_stream(gateway: str, fake: FakeUpstream) -> None:
    """Read one chunk of a dripping stream, hang up, and wait for the upstream call to be aborted."""
    body = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "mode:drip"}], "stream": True}
    with httpx.stream("POST", gateway + "/v1/chat/completions", json=body, timeout=10) as r:
        for _ in r.iter_raw():
            break
        assert fake.active == 1
    deadline = time.monotonic() + 15  # generous: shared, loaded CI machines
    while fake.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.active == 0
    assert fake.aborted == 1


def test_client_disconnect_aborts_upstream_stream(gateway: str, fake_upstream) -> None:
    leave_mid_stream(gateway, fake_upstream[0])


def test_unknown_route_is_openai_404(gateway: str) -> None:
    r = httpx.get(gateway + "/v1/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"


def test_health_ready_metrics_answer(gateway: str) -> None:
    assert httpx.get(gateway + "/health").json() == {"status": "ok"}
    assert httpx.get(gateway + "/ready").status_code == 200
    assert httpx.get(gateway + "/metrics").status_code == 200
