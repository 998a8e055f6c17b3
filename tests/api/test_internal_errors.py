"""An exception anywhere on the request path reaches the client as a 500 in its API's envelope (with the request
id), or as the surface's error event once a stream is under way; never as a bare text body."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from app.api.app import create_app
from tests.conftest import PUBLIC_MODEL, gateway_config
from tests.servers import FakeUpstream, serve_in_thread

CHAT = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]}


def boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected failure")


async def aboom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected failure")


@pytest.fixture
def gw() -> Iterator[tuple[str, Any]]:
    """A gateway in front of the fake upstream; yields its URL and the GatewayApp."""
    fake = FakeUpstream()
    with serve_in_thread(fake.app()) as up:
        app = create_app(gateway_config([up], tenants=[{"id": "acme", "api_keys": ["sk-acme"]}]))
        with serve_in_thread(app) as url:
            yield url, app


def test_a_failing_stage_is_a_500_in_openais_envelope_with_the_request_id(
    gw: tuple[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = gw
    monkeypatch.setattr("app.pipeline.classify", boom)
    with caplog.at_level(logging.ERROR, logger="app.api.proxy"):
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "rid-boom-1"})
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == "internal_error" and err["type"] == "server_error" and "rid-boom-1" in err["message"]
    assert r.headers["x-request-id"] == "rid-boom-1"
    assert any("rid-boom-1" in rec.getMessage() and rec.exc_info for rec in caplog.records)
    with pytest.raises(openai.InternalServerError):
        openai.OpenAI(base_url=url + "/v1", api_key="sk-acme", max_retries=0).chat.completions.create(
            model=PUBLIC_MODEL, messages=[{"role": "user", "content": "hi"}]
        )


def test_a_failing_stage_on_messages_is_a_500_in_anthropics_envelope(
    gw: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = gw
    monkeypatch.setattr("app.pipeline.classify", boom)
    body = {"model": PUBLIC_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(url + "/v1/messages", json=body)
    assert r.status_code == 500
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    with pytest.raises(anthropic.InternalServerError):
        anthropic.Anthropic(base_url=url, api_key="sk-acme", max_retries=0).messages.create(
            model=PUBLIC_MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )


def test_a_failure_after_the_stream_started_ends_it_with_the_error_event(
    gw: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, app = gw
    monkeypatch.setattr(app.api.state.gateway.settler, "settle", aboom)
    with httpx.stream("POST", url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        assert r.status_code == 200
        text = r.read().decode()
    events = [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
    assert orjson.loads(events[0])["choices"][0]["delta"]["content"] == "Hello"
    assert orjson.loads(events[-1])["error"]["code"] == "internal_error"


def test_parse_failures_and_control_routes_answer_in_the_envelope(
    gw: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, app = gw
    monkeypatch.setattr("app.api.proxy.parse_request", boom)
    r = httpx.post(url + "/v1/completions", json={"model": PUBLIC_MODEL, "prompt": "x"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    monkeypatch.setattr(app.api.state.gateway, "unready_models", boom)
    r = httpx.get(url + "/ready")
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    monkeypatch.setattr(app.api.state.gateway.responses, "recall", aboom)
    r = httpx.get(url + "/v1/responses/resp_1")
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
