"""/tokenize, /detokenize and vLLM's pooling family passed through, and GET /v1/models/{id}.

The adapter's own behaviour first, then the gateway in front of a recording upstream (the sim serves only
/tokenize of these, so the rest is shaped as vLLM 0.32 answers it) and in front of a sim for /tokenize.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.context import RequestContext
from app.errors import GatewayError
from app.limits import cap_max_tokens, estimate_input_tokens, max_output_tokens
from app.sim.testing import running_sim
from app.surfaces import SURFACES
from app.surfaces.passthrough import CLASSIFY, DETOKENIZE, PASSTHROUGH_SURFACES, RERANK, SCORE, TOKENIZE
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway
from tests.servers import serve_in_thread

SERVED = "served-model"
POOLING_PATHS = ["/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score", "/pooling", "/classify"]
ALL_PATHS = ["/tokenize", "/detokenize", *POOLING_PATHS]


# -- the adapter ----------------------------------------------------------------------------------


def test_every_vllm_pass_through_path_has_a_surface() -> None:
    for path in ALL_PATHS:
        assert SURFACES[path] is PASSTHROUGH_SURFACES[path]
    assert SURFACES["/v1/rerank"] is SURFACES["/rerank"] is RERANK
    assert {s.operation for s in PASSTHROUGH_SURFACES.values()} == {"tokenize", "embeddings"}


@pytest.mark.parametrize("surface", list(dict.fromkeys(PASSTHROUGH_SURFACES.values())), ids=lambda s: s.name)
def test_pass_through_is_never_normalized_scheduled_or_streamed(surface: Any) -> None:
    assert not surface.normalizable and not surface.schedules and not surface.can_stream
    body = {"model": PUBLIC_MODEL, "prompt": "hi"}
    out = surface.upstream_body(body, served_model=SERVED, priority=5, cache_salt="salt")
    assert out == {"model": SERVED, "prompt": "hi"}
    assert body["model"] == PUBLIC_MODEL  # the client's body is not mutated
    with pytest.raises(GatewayError) as err:
        surface.validate({"model": PUBLIC_MODEL, "stream": True})
    assert (err.value.status, err.value.param) == (400, "stream")
    assert surface.validate({"model": PUBLIC_MODEL}).stream is False


def test_prompt_view_has_no_text_so_limits_count_requests_not_tokens() -> None:
    body = {"model": PUBLIC_MODEL, "query": "q" * 4000, "documents": ["d" * 4000], "max_tokens": 9}
    view = RERANK.view(body)
    assert view.text_chars == 0 and view.key_head == "q" * len(view.key_head) and view.key_head
    assert estimate_input_tokens(view) == 0
    assert max_output_tokens(body, RERANK.output_cap_fields) == 0


def test_degrade_leaves_a_body_without_an_output_cap_alone() -> None:
    body: dict[str, Any] = {"model": PUBLIC_MODEL, "prompt": "hi"}
    cap_max_tokens(body, 256, TOKENIZE.output_cap_fields)
    assert body == {"model": PUBLIC_MODEL, "prompt": "hi"}


def test_key_head_follows_the_body_shape() -> None:
    assert str(TOKENIZE.view({"messages": [{"role": "system", "content": "S" * 300}]}).key_head).startswith("SSS")
    assert str(TOKENIZE.view({"prompt": "P" * 300}).key_head).startswith("PPP")
    assert isinstance(DETOKENIZE.view({"tokens": list(range(64))}).key_head, bytes)
    assert str(SCORE.view({"text_1": "A" * 300, "text_2": "B"}).key_head).startswith("AAA")
    assert CLASSIFY.view({}).key_head == ""


def test_upstream_route_not_found_becomes_an_openai_envelope_and_vllm_errors_pass_unchanged() -> None:
    got = orjson.loads(RERANK.upstream_error(404, b'{"detail":"Not Found"}'))
    assert got == {"error": {"message": "This model's replicas do not serve rerank.", "type": "invalid_request_error",
                             "param": None, "code": "unknown_url"}}  # fmt: skip
    vllm = b'{"error":{"message":"bad","type":"BadRequestError","param":"body.tokens","code":400}}'
    assert DETOKENIZE.upstream_error(400, vllm) is vllm
    assert TOKENIZE.upstream_error(502, b"<html>") == b"<html>"


def test_reply_usage_is_captured_and_the_model_name_made_public() -> None:
    reply = {"id": "rerank-1", "model": SERVED, "usage": {"prompt_tokens": 9, "total_tokens": 9}, "results": []}
    ctx = RequestContext("r", RERANK, "/rerank", {}, PUBLIC_MODEL, False, False, {})
    RERANK.read_reply(reply, ctx)
    assert (ctx.usage.prompt_tokens, ctx.usage.reported, ctx.response_id) == (9, True, "rerank-1")
    assert orjson.loads(RERANK.public_body(orjson.dumps(reply), SERVED, PUBLIC_MODEL))["model"] == PUBLIC_MODEL


def test_input_messages_read_chat_and_text_bodies() -> None:
    chat = TOKENIZE.input_messages({"messages": [{"role": "user", "content": "hi"}]})
    assert chat == [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    texts = CLASSIFY.input_messages({"input": ["a", "b"]})
    assert [m["parts"][0]["content"] for m in texts] == ["a", "b"]


# -- through the gateway, in front of a recording upstream ------------------------------------------


@dataclass
class RecordingUpstream:
    """Answers the pass-through paths with vLLM 0.32's shapes and records what it got."""

    not_served: set[str] = field(default_factory=set)  # paths answered with FastAPI's 404, as an unregistered route
    seen: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)

    def app(self) -> Starlette:
        routes = [Route(p, self._answer, methods=["POST"]) for p in ALL_PATHS]
        routes += [Route("/health", lambda r: Response("")), Route("/metrics", lambda r: Response(""))]
        return Starlette(routes=routes)

    async def _answer(self, request: Request) -> Response:
        path = request.url.path
        body = orjson.loads(await request.body())
        self.seen.append((path, body, dict(request.headers)))
        if path in self.not_served:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        usage = {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0, "prompt_tokens_details": None}
        model = body["model"]
        replies: dict[str, Any] = {
            "/tokenize": {"count": 2, "max_model_len": 2048, "tokens": [19556, 905], "token_strs": None},
            "/detokenize": {"prompt": "Hello world"},
            "/rerank": {"id": "rerank-1", "model": model, "usage": {"prompt_tokens": 7, "total_tokens": 7},
                        "results": [{"index": 0, "document": {"text": "b", "multi_modal": None},
                                     "relevance_score": 0.5}]},
            "/score": {"id": "score-1", "object": "list", "created": 1, "model": model,
                       "data": [{"index": 0, "object": "score", "score": 0.25}], "usage": usage},
            "/pooling": {"id": "pool-1", "object": "list", "created": 1, "model": model,
                         "data": [{"index": 0, "object": "pooling", "data": [0.1, 0.2]}], "usage": usage},
            "/classify": {"id": "classify-1", "object": "list", "created": 1, "model": model,
                          "data": [{"index": 0, "label": "pos", "probs": [0.9, 0.1], "num_classes": 2}],
                          "usage": usage},
        }  # fmt: skip
        key = "/" + path.rsplit("/", 1)[-1]
        return JSONResponse(replies[key])


TENANT = {"id": "acme", "api_keys": ["sk-acme"], "limits": {"rpm": 1000}}


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[RecordingUpstream, str]]:
    rec = RecordingUpstream(not_served={"/classify"})
    with serve_in_thread(rec.app()) as url:
        yield rec, url


@pytest.fixture(scope="module")
def gateway(upstream: tuple[RecordingUpstream, str]) -> Iterator[str]:
    _, url = upstream
    cfg = gateway_config([url], tenants=[TENANT], auth={"required": True})
    with running_gateway(cfg) as gw:
        yield gw


def post(gw: str, path: str, body: Any, key: str | None = "sk-acme", **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(gw + path, json=body, headers=headers, timeout=10, **kw)


BODIES: dict[str, dict[str, Any]] = {
    "/tokenize": {"prompt": "Hello world"},
    "/detokenize": {"tokens": [19556, 905]},
    "/v1/rerank": {"query": "a", "documents": ["b"]},
    "/rerank": {"query": "a", "documents": ["b"]},
    "/v2/rerank": {"query": "a", "documents": ["b"]},
    "/v1/score": {"text_1": "a", "text_2": "b"},
    "/score": {"queries": "a", "documents": ["b"]},
    "/pooling": {"input": "a"},
}


@pytest.mark.parametrize("path", list(BODIES))
def test_pass_through_maps_the_model_name_in_and_out_and_adds_no_scheduling_fields(
    gateway: str, upstream: tuple[RecordingUpstream, str], path: str
) -> None:
    rec, _ = upstream
    body = {"model": PUBLIC_MODEL, **BODIES[path]}
    resp = post(gateway, path, body)
    assert resp.status_code == 200, resp.text
    got_path, got_body, got_headers = rec.seen[-1]
    assert got_path == path
    assert got_body == {**body, "model": SERVED}  # exactly the client's fields, no priority/cache_salt/stream_options
    assert got_headers["x-request-id"] == resp.headers["x-request-id"]
    doc = resp.json()
    assert doc.get("model", PUBLIC_MODEL) == PUBLIC_MODEL and SERVED not in resp.text
    assert "pool=main" in resp.headers["x-kvgate-route"]


def test_tokenize_reply_is_relayed_as_vllm_wrote_it(gateway: str) -> None:
    resp = post(gateway, "/tokenize", {"model": PUBLIC_MODEL, "prompt": "Hello world"})
    assert resp.json() == {"count": 2, "max_model_len": 2048, "tokens": [19556, 905], "token_strs": None}
    assert float(resp.headers["x-kvgate-cost-usd"]) == 0  # no usage reported, nothing billed


def test_pooling_reply_with_usage_is_priced(gateway: str) -> None:
    resp = post(gateway, "/score", {"model": PUBLIC_MODEL, "text_1": "a", "text_2": "b"})
    assert resp.json()["usage"]["prompt_tokens"] == 7
    assert float(resp.headers["x-kvgate-cost-usd"]) > 0


def test_route_the_replicas_do_not_serve_answers_in_openai_envelope(gateway: str) -> None:
    resp = post(gateway, "/classify", {"model": PUBLIC_MODEL, "input": "a"})
    assert resp.status_code == 404
    assert resp.json()["error"] == {"message": "This model's replicas do not serve classify.",
                                    "type": "invalid_request_error", "param": None, "code": "unknown_url"}  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "key", "status", "code"),
    [
        ("/tokenize", {"model": PUBLIC_MODEL, "prompt": "x"}, None, 401, "invalid_api_key"),
        ("/rerank", {"model": PUBLIC_MODEL, "query": "a"}, "sk-wrong", 401, "invalid_api_key"),
        ("/detokenize", {"model": "nope", "tokens": [1]}, "sk-acme", 404, "model_not_found"),
        ("/score", {"text_1": "a"}, "sk-acme", 400, None),
        ("/pooling", {"model": PUBLIC_MODEL, "input": "a", "stream": True}, "sk-acme", 400, None),
        ("/tokenize", {"model": PUBLIC_MODEL, "prompt": "x", "stream": "yes"}, "sk-acme", 400, None),
        ("/v1/rerank", ["not", "an", "object"], "sk-acme", 400, "invalid_json"),
    ],
)  # fmt: skip
def test_gateway_errors_on_pass_through_paths_are_openai_envelopes(
    gateway: str, path: str, body: Any, key: str | None, status: int, code: str | None
) -> None:
    resp = post(gateway, path, body, key=key)
    assert resp.status_code == status
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["message"]


def test_malformed_json_and_wrong_method_are_4xx_envelopes(gateway: str) -> None:
    resp = httpx.post(gateway + "/tokenize", content=b"{nope", headers={"authorization": "Bearer sk-acme"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    resp = httpx.get(gateway + "/rerank")
    assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed"


def test_rpm_limit_counts_pass_through_requests(upstream: tuple[RecordingUpstream, str]) -> None:
    _, url = upstream
    tenant = {"id": "tight", "api_keys": ["sk-tight"], "limits": {"rpm": 2, "tpm": 1}}
    with running_gateway(gateway_config([url], tenants=[tenant], auth={"required": True})) as gw:
        # tpm 1 would refuse any request charged tokens: these are charged none
        codes = [post(gw, "/tokenize", {"model": PUBLIC_MODEL, "prompt": "x" * 400}, key="sk-tight").status_code
                 for _ in range(2)]  # fmt: skip
        assert codes == [200, 200]
        over = post(gw, "/rerank", {"model": PUBLIC_MODEL, "query": "a", "documents": ["b"]}, key="sk-tight")
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
    assert over.json()["error"]["code"] == "rate_limit_exceeded"


def test_degraded_pass_through_is_served_without_an_output_cap(upstream: tuple[RecordingUpstream, str]) -> None:
    rec, url = upstream
    tenant = {"id": "soft", "api_keys": ["sk-soft"], "limits": {"rpm": 1, "on_exceed": "degrade"}}
    with running_gateway(gateway_config([url], tenants=[tenant], auth={"required": True})) as gw:
        post(gw, "/tokenize", {"model": PUBLIC_MODEL, "prompt": "x"}, key="sk-soft")
        resp = post(gw, "/tokenize", {"model": PUBLIC_MODEL, "prompt": "x"}, key="sk-soft")
    assert resp.status_code == 200 and resp.headers["x-kvgate-limit"].startswith("degraded:rpm")
    assert rec.seen[-1][1] == {"model": SERVED, "prompt": "x"}


# -- GET /v1/models/{id} --------------------------------------------------------------------------


def test_models_retrieve_returns_the_listed_card(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-acme", max_retries=0)
    card = client.models.retrieve(PUBLIC_MODEL)
    listed = next(m for m in client.models.list().data if m.id == PUBLIC_MODEL)
    assert card == listed
    assert (card.id, card.object, card.owned_by) == (PUBLIC_MODEL, "model", "kvgate")


def test_models_retrieve_unknown_is_a_404_in_openai_envelope(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-acme", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.code == "model_not_found" and err.value.param == "model"
    resp = httpx.get(gateway + "/v1/models/org/with-slash")
    assert resp.status_code == 404 and "org/with-slash" in resp.json()["error"]["message"]


# -- /tokenize in front of a sim ------------------------------------------------------------------


def test_tokenize_through_the_gateway_matches_the_sim_directly() -> None:
    with running_sim(model=SERVED) as sim, running_gateway(gateway_config([sim])) as gw:
        chat = {"messages": [{"role": "user", "content": "Hello there"}]}
        via = httpx.post(gw + "/tokenize", json={"model": PUBLIC_MODEL, **chat}).json()
        direct = httpx.post(sim + "/tokenize", json={"model": SERVED, **chat}).json()
        assert via == direct and via["count"] > 0
        # the sim's own 404 for a model it does not serve cannot happen: the name is always mapped
        wrong = httpx.post(gw + "/tokenize", json={"model": "other", "prompt": "x"})
        assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
