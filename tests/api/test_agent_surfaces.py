"""The Responses API and Anthropic Messages through the gateway, with the official SDKs, in front of sims."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from app.sim.testing import running_sim
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway

SYSTEM = "You are a coding agent. Follow the repository's conventions and run the tests. " * 12
TENANT = {"id": "acme", "api_keys": ["sk-acme"], "normalize": "on"}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str]]:
    """Two sims (responses store on) behind one gateway with a normalizing tenant; yields (gateway, sim0)."""
    with running_sim(model="served-model", enable_responses_store=True) as a, running_sim(
        model="served-model", enable_responses_store=True
    ) as b:
        cfg = gateway_config([a, b], tenants=[TENANT], auth={"required": True})
        with running_gateway(cfg) as gw:
            yield gw, a


def oai(gw: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw + "/v1", api_key="sk-acme", max_retries=0)


def ant(gw: str, key: str = "sk-acme") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw, api_key=key, max_retries=0)


# -- Responses -------------------------------------------------------------------------------------
def test_responses_create_returns_the_public_model_usage_and_cost(stack: tuple[str, str]) -> None:
    gw, _ = stack
    raw = oai(gw).responses.with_raw_response.create(model=PUBLIC_MODEL, input="Say hi", max_output_tokens=8)
    r = raw.parse()
    assert r.model == PUBLIC_MODEL and r.output_text
    assert r.usage is not None and r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert float(raw.headers["x-kvgate-cost-usd"]) > 0
    assert "pool=main" in raw.headers["x-kvgate-route"]


def test_responses_stream_relays_the_event_sequence_and_ends_with_a_cost_comment(stack: tuple[str, str]) -> None:
    gw, _ = stack
    events = list(oai(gw).responses.create(model=PUBLIC_MODEL, input="Say hi", max_output_tokens=8, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    done = events[-1].response  # type: ignore[union-attr]
    assert done.model == PUBLIC_MODEL and done.usage is not None
    body = {"model": PUBLIC_MODEL, "input": "hi", "stream": True, "max_output_tokens": 4}
    text = httpx.post(gw + "/v1/responses", json=body, headers={"authorization": "Bearer sk-acme"}).text
    assert ": x-kvgate-cost-usd " in text and "[DONE]" not in text


def test_responses_async_client_works(stack: tuple[str, str]) -> None:
    gw, _ = stack

    async def go() -> str:
        c = openai.AsyncOpenAI(base_url=gw + "/v1", api_key="sk-acme", max_retries=0)
        r = await c.responses.create(model=PUBLIC_MODEL, input="Say hi", max_output_tokens=4)
        await c.close()
        return r.output_text

    assert asyncio.run(go())


def test_previous_response_id_and_get_and_cancel_reach_the_replica_that_holds_it(stack: tuple[str, str]) -> None:
    gw, _ = stack
    c = oai(gw)
    first = c.responses.create(model=PUBLIC_MODEL, input="Remember 7.", max_output_tokens=4)
    # Round robin would alternate replicas: without affinity one of these would 404 on the other sim.
    for _ in range(3):
        follow = c.responses.create(model=PUBLIC_MODEL, input="Which number?", previous_response_id=first.id,
                                    max_output_tokens=4)  # fmt: skip
        assert follow.id != first.id
        got = c.responses.retrieve(first.id)
        assert got.id == first.id and got.model == PUBLIC_MODEL


def test_an_unknown_response_id_is_a_404_in_openai_shape(stack: tuple[str, str]) -> None:
    gw, _ = stack
    with pytest.raises(openai.NotFoundError):
        oai(gw).responses.retrieve("resp_0000000000000000")
    with pytest.raises(openai.NotFoundError):
        oai(gw).responses.create(model=PUBLIC_MODEL, input="x", previous_response_id="resp_nope")


def test_responses_bad_input_is_a_400_never_a_5xx(stack: tuple[str, str]) -> None:
    gw, _ = stack
    h = {"authorization": "Bearer sk-acme", "content-type": "application/json"}
    for body in (b"{not json", b'{"model": "public-model", "input": 3}', b'{"model": "public-model", "input": [1]}',
                 b'{"model": "public-model", "input": "x", "max_output_tokens": -1}'):  # fmt: skip
        r = httpx.post(gw + "/v1/responses", content=body, headers=h)
        assert r.status_code == 400, body
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_responses_normalization_moves_the_volatile_environment_line(stack: tuple[str, str]) -> None:
    gw, _ = stack
    raw = oai(gw).responses.with_raw_response.create(
        model=PUBLIC_MODEL, instructions=SYSTEM,
        input=[{"role": "user", "content": "<environment_context>\nCurrent date: 2026-12-01T10:11:12Z\n"
                "</environment_context>\nFix the test."}],
        max_output_tokens=4,
    )  # fmt: skip
    assert raw.headers["x-kvgate-normalized"].startswith("on;moved=1")


# -- Messages ----------------------------------------------------------------------------------------
def test_messages_create_with_x_api_key_returns_usage_and_the_public_model(stack: tuple[str, str]) -> None:
    gw, _ = stack
    raw = ant(gw).messages.with_raw_response.create(
        model=PUBLIC_MODEL, max_tokens=8, system=SYSTEM, messages=[{"role": "user", "content": "Say hi"}]
    )
    m = raw.parse()
    assert m.model == PUBLIC_MODEL and m.content[0].type == "text"
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0 and m.usage.output_tokens > 0
    assert float(raw.headers["x-kvgate-cost-usd"]) > 0


def test_messages_stream_yields_text_and_final_usage(stack: tuple[str, str]) -> None:
    gw, _ = stack
    with ant(gw).messages.stream(model=PUBLIC_MODEL, max_tokens=8,
                                 messages=[{"role": "user", "content": "Say hi"}]) as s:  # fmt: skip
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.model == PUBLIC_MODEL and final.usage.output_tokens > 0


def test_count_tokens_answers_through_the_gateway(stack: tuple[str, str]) -> None:
    gw, _ = stack
    n = ant(gw).messages.count_tokens(model=PUBLIC_MODEL, messages=[{"role": "user", "content": "Say hi"}])
    assert n.input_tokens > 0


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ({"key": "sk-wrong"}, anthropic.AuthenticationError),
        ({"model": "no-such-model"}, anthropic.NotFoundError),
        ({"max_tokens": None}, anthropic.BadRequestError),
        ({"messages": []}, anthropic.BadRequestError),
    ],
)
def test_messages_errors_come_in_anthropics_envelope(stack: tuple[str, str], call: dict[str, Any], error: type) -> None:
    gw, _ = stack
    kw: dict[str, Any] = {"model": PUBLIC_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    key = call.pop("key", "sk-acme")
    kw.update(call)
    if kw["max_tokens"] is None:
        r = httpx.post(gw + "/v1/messages", json={k: v for k, v in kw.items() if k != "max_tokens"},
                       headers={"x-api-key": key})  # fmt: skip
        assert r.status_code == 400 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"
        return
    with pytest.raises(error) as info:
        ant(gw, key).messages.create(**kw)
    body = info.value.body  # type: ignore[attr-defined]
    assert isinstance(body, dict) and body["type"] == "error" and "message" in body["error"]


def test_messages_rate_limit_is_a_429_rate_limit_error_with_retry_after() -> None:
    with running_sim(model="served-model") as a:
        tenant = {**TENANT, "limits": {"rpm": 1}}
        with running_gateway(gateway_config([a], tenants=[tenant], auth={"required": True})) as gw:
            ant(gw).messages.create(model=PUBLIC_MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
            with pytest.raises(anthropic.RateLimitError) as info:
                ant(gw).messages.create(model=PUBLIC_MODEL, max_tokens=4,
                                        messages=[{"role": "user", "content": "hi"}])  # fmt: skip
            assert info.value.response.headers["retry-after"]
            assert info.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]


def test_messages_malformed_json_is_a_400_in_anthropics_envelope(stack: tuple[str, str]) -> None:
    gw, _ = stack
    r = httpx.post(gw + "/v1/messages", content=b"{oops", headers={"x-api-key": "sk-acme"})
    assert r.status_code == 400 and r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                                               "message": r.json()["error"]["message"]}}


def test_messages_normalization_moves_the_billing_nonce_to_a_trailing_block(stack: tuple[str, str]) -> None:
    gw, _ = stack
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; "
               "cch=4f8a2;\nSession ID: 5b2f7c1e-3d4a-4b6c-8e9f-0a1b2c3d4e5f\n" + SYSTEM}]  # fmt: skip
    raw = ant(gw).messages.with_raw_response.create(model=PUBLIC_MODEL, max_tokens=4, system=system,  # type: ignore[arg-type]
                                                    messages=[{"role": "user", "content": "Fix it."}])  # fmt: skip
    assert raw.headers["x-kvgate-normalized"].startswith("on;moved=")
    assert "moved=0" not in raw.headers["x-kvgate-normalized"]


def test_a_billing_only_system_block_is_left_out_of_the_routing_key_and_normalization() -> None:
    from app.surfaces import MESSAGES

    def view(nonce: str) -> Any:
        return MESSAGES.view({"system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch={nonce};"},
            {"type": "text", "text": SYSTEM}], "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip

    a, b = view("4f8a2"), view("91c0e")
    assert a.key_head == b.key_head  # the nonce does not decide the replica
    assert [s.text for s in a.head] == [SYSTEM, "hi"]
    mixed = MESSAGES.view({"system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;\n" + SYSTEM}],
                           "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert mixed.head[0].text.startswith("x-anthropic-billing-header")  # moved, so vLLM keeps the rest
    assert str(mixed.key_head).startswith(SYSTEM[:100])
