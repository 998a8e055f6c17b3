"""Property-based fuzz of every inference path (app.surfaces.SURFACES) against the gateway in front of a sim:
random bodies (fields of the wrong type or missing, deep nesting, huge numbers, unicode, non-objects, malformed
bytes) never get a 5xx other than an upstream condition (502/503/504), and every error is in its API's envelope:
OpenAI's `{"error": {"message", "type", …}}`, Anthropic's `{"type": "error", "error": {"type", "message"}}` on
/v1/messages*."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.sim.options import SimOptions
from app.sim.server import create_sim_app
from app.surfaces import SURFACES
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway
from tests.servers import serve_in_thread

UPSTREAM_CONDITIONS = {502, 503, 504}
MSGS = [{"role": "user", "content": "hi"}]
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": MSGS, "max_tokens": 4},
    "/v1/completions": {"prompt": "hi", "max_tokens": 4},
    "/v1/embeddings": {"input": "hi"},
    "/v1/responses": {"input": "hi", "max_output_tokens": 4},
    "/v1/messages": {"messages": MSGS, "max_tokens": 4},
    "/v1/messages/count_tokens": {"messages": MSGS},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [1, 2, 3]},
}
DEFAULT_BASE = {"query": "a", "documents": ["b"], "text_1": "a", "text_2": "b", "input": "hi"}
KEYS = ["model", "messages", "prompt", "input", "max_tokens", "max_output_tokens", "max_completion_tokens", "stream",
        "stream_options", "temperature", "top_p", "n", "tools", "tool_choice", "system", "instructions", "stop",
        "previous_response_id", "logprobs", "response_format", "metadata", "tokens", "query", "documents",
        "thinking", "priority", "cache_salt", "chat_template_kwargs"]
PATHS = sorted(SURFACES)

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6),
                      inner, max_size=3), max_leaves=10)
messages = st.lists(st.dictionaries(st.sampled_from(["role", "content", "name", "tool_calls", "type"]),
                                    values | st.sampled_from(["user", "system", "assistant", "tool"]), max_size=3),
                    max_size=3)


def base(path: str) -> dict[str, Any]:
    return {"model": PUBLIC_MODEL, **BASES.get(path, DEFAULT_BASE)}


def nested(depth: int, leaf: Any = "x") -> Any:
    out: Any = leaf
    for i in range(depth):
        out = [out] if i % 2 else {"k": out}
    return out


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    """One request body for `path`: mostly a valid one with a few fields broken, sometimes no JSON at all."""
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "deep", "huge", "value", "bytes", "truncated"]))
    body = base(path)
    if kind == "value":
        return json.dumps(draw(values)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "truncated":
        raw = json.dumps(body).encode()
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if kind == "deep":
        key = draw(st.sampled_from(KEYS))
        body[key] = nested(draw(st.sampled_from([254, 256, 300, 600, 1100])))
        return json.dumps(body).encode()
    if kind == "huge":
        key = draw(st.sampled_from(["max_tokens", "temperature", "n", "top_p", "max_output_tokens", "priority"]))
        number = draw(st.sampled_from(["1" + "0" * 400, "-1e400", "1e400", "18446744073709551616", "1.5e-400"]))
        raw = json.dumps({**body, key: "@@"}).encode()
        return raw.replace(b'"@@"', number.encode())
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(KEYS))
        action = draw(st.sampled_from(["set", "set", "drop", "messages"]))
        if action == "drop":
            body.pop(key, None)
        elif action == "messages":
            body["messages"] = draw(messages)
        else:
            body[key] = draw(values)
    if draw(st.booleans()):
        body.setdefault("stream", draw(st.booleans()))
    return json.dumps(body, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(PATHS))
    return path, draw(bodies(path))


class FastApiNotFound:
    """The sim's unknown routes answered as vLLM (a FastAPI app) answers them: 404 `{"detail": "Not Found"}`.

    The sim serves no pooling endpoints and its framework's 404 is plain text; vLLM's is JSON, which the
    pass-through surfaces translate into OpenAI's envelope.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 0

        async def relay(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if status == 404:
                    body = b'{"detail":"Not Found"}'
                    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                    await send({"type": "http.response.start", "status": 404, "headers": headers})
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                    return
            elif status == 404:
                return
            await send(message)

        await self.app(scope, receive, relay)


@pytest.fixture(scope="module")
def gw() -> Iterator[httpx.Client]:
    """A gateway in front of a fast sim, and a client for it."""
    sim_app = FastApiNotFound(create_sim_app(SimOptions(model="served-model", time_scale=1000.0)))
    with (
        serve_in_thread(sim_app) as sim,
        running_gateway(gateway_config([sim])) as url,
        httpx.Client(base_url=url, timeout=20) as client,
    ):
        yield client


def assert_envelope(path: str, status: int, body: bytes) -> None:
    doc = json.loads(body)
    if path.startswith("/v1/messages"):
        assert doc["type"] == "error", body
        assert isinstance(doc["error"]["type"], str) and isinstance(doc["error"]["message"], str), body
    else:
        assert isinstance(doc["error"]["message"], str), body
        assert isinstance(doc["error"]["type"], str), body


@pytest.mark.slow  # ~45 s on the shared 2-core machine: CI's slow group of the fast tier
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(request=requests())
def test_no_body_gets_a_5xx_or_an_error_outside_its_envelope(gw: httpx.Client, request: tuple[str, bytes]) -> None:
    path, raw = request
    headers = {"content-type": "application/json"}
    with gw.stream("POST", path, content=raw, headers=headers) as r:
        body = r.read()
    assert r.status_code < 500 or r.status_code in UPSTREAM_CONDITIONS, (path, raw[:300], r.status_code, body[:300])
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith("application/json"), (path, raw[:200], body[:200])
        assert_envelope(path, r.status_code, body)
