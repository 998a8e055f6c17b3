"""Hostile inputs against the gateway as `kvgate serve` serves it: every one answered 4xx in its API's envelope,
never a 5xx, never an effect on the process (headers bounded, multipliers bounded, nesting of any depth, parse
errors, duplicate keys, another tenant's stored response, a client's cache_salt, the control paths)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from app.api.client_address import ClientAddresses
from app.config.listen import Listen
from app.normalize.salt import DEFAULT_SECRET, cache_salt_for, client_salt, salt_secret_problem
from app.sim.testing import running_sim
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway, running_guarded_gateway
from tests.servers import FakeUpstream, free_port, serve_in_thread

ACME, BETA, ADMIN = "sk-hostile-acme", "sk-hostile-beta", "sk-hostile-admin"
TENANTS = [{"id": "acme", "api_keys": [ACME]}, {"id": "beta", "api_keys": [BETA], "shared_cache": True}]
CHAT = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with serve_in_thread(fake.app()) as url:
        yield fake, url


@pytest.fixture(scope="module")
def gw(upstream: tuple[FakeUpstream, str]) -> Iterator[str]:
    """The guarded server, auth required, two tenants, an admin key, /metrics behind it."""
    cfg = gateway_config([upstream[1]], tenants=TENANTS, listen={"host": "127.0.0.1", "port": free_port()},
                         auth={"required": True, "admin_keys": [ADMIN], "metrics_access": "admin_key"})
    with running_guarded_gateway(cfg) as url:
        yield url


def raw_exchange(url: str, payload: bytes, *, read_limit: int = 65536) -> bytes:
    """Send raw bytes on a fresh socket (stopping if the server closes it) and read what comes back."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        try:
            for i in range(0, len(payload), 1 << 16):
                s.sendall(payload[i : i + (1 << 16)])
        except OSError:
            pass  # the server answered and closed before the rest was sent: what a bound looks like
        out = b""
        try:
            while len(out) < read_limit:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except OSError:
            pass
        return out


def status_and_body(response: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return int(head.split(b" ", 2)[1]), orjson.loads(body)


# -- headers and HTTP parsing -------------------------------------------------------------------------
@pytest.mark.parametrize("size", [100 * 1024, 16 * 1024 * 1024])
def test_headers_over_max_header_bytes_get_431_in_the_envelope(gw: str, size: int) -> None:
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nx-big: " + b"a" * size + b"\r\n"
               b"content-length: 2\r\n\r\n{}")
    status, body = status_and_body(raw_exchange(gw, request))
    assert status == 431 and body["error"]["code"] == "request_headers_too_large"


def test_too_many_headers_get_431_and_a_messages_path_gets_anthropics_envelope(gw: str) -> None:
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(200))
    status, body = status_and_body(raw_exchange(gw, b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\n" + many + b"\r\n"))
    assert status == 431 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def test_headers_within_the_bounds_are_served(gw: str) -> None:
    headers = {"authorization": f"Bearer {ACME}", "x-pad": "p" * 32 * 1024}
    headers.update({f"x-h{i}": "v" for i in range(60)})
    assert httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=headers).status_code == 200


@pytest.mark.parametrize("garbage", [b"GARBAGE\r\n\r\n", b"POST /v1/chat/completions HTTP/1.1\r\nbad header\r\n\r\n",
                                     b"GET /\x00 HTTP/1.1\r\n\r\n"])
def test_malformed_http_gets_a_400_in_the_envelope_not_text(gw: str, garbage: bytes) -> None:
    status, body = status_and_body(raw_exchange(gw, garbage))
    assert status == 400 and body["error"]["code"] == "invalid_http"


# -- multipliers and nesting --------------------------------------------------------------------------
def post(gw: str, path: str, body: dict[str, Any], key: str = ACME, **headers: str) -> httpx.Response:
    return httpx.post(gw + path, json=body, headers={"authorization": f"Bearer {key}", **headers}, timeout=10)


@pytest.mark.parametrize(("field", "value"), [("n", 10**9), ("n", 129), ("best_of", 1000), ("top_logprobs", 21),
                                              ("logprobs", 50), ("n", 0)])
def test_multipliers_out_of_bounds_are_400_and_never_reach_the_engine(
    gw: str, upstream: tuple[FakeUpstream, str], field: str, value: int
) -> None:
    before = len(upstream[0].seen)
    path = "/v1/completions" if field in ("best_of", "logprobs") else "/v1/chat/completions"
    body = {"model": PUBLIC_MODEL, "prompt": "hi"} if path == "/v1/completions" else dict(CHAT)
    r = post(gw, path, {**body, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert len(upstream[0].seen) == before


def test_multipliers_within_bounds_pass(gw: str) -> None:
    assert post(gw, "/v1/chat/completions", {**CHAT, "n": 128, "logprobs": True, "top_logprobs": 20}).status_code == 200


def nested(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [65, 500, 990, 1023, 5000])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", lambda d: {**CHAT, "messages": [{"role": "user", "content": nested(d)}]}),
        ("/v1/completions", lambda d: {"model": PUBLIC_MODEL, "prompt": nested(d)}),
        ("/v1/embeddings", lambda d: {"model": PUBLIC_MODEL, "input": nested(d)}),
        ("/v1/responses", lambda d: {"model": PUBLIC_MODEL, "input": [{"role": "user", "content": nested(d)}]}),
        ("/v1/messages", lambda d: {"model": PUBLIC_MODEL, "max_tokens": 4,
                                    "messages": [{"role": "user", "content": nested(d)}]}),
    ],
)
def test_nesting_of_any_depth_is_400_never_500(gw: str, path: str, body: Any, depth: int) -> None:
    # orjson.dumps writes 255 levels at most: the body is written by hand.
    raw = orjson.dumps(body(0)).replace(b'"content":"x"', b'"content":' + b"[" * depth + b'"x"' + b"]" * depth)
    raw = raw.replace(b'"prompt":"x"', b'"prompt":' + b"[" * depth + b'"x"' + b"]" * depth)
    raw = raw.replace(b'"input":"x"', b'"input":' + b"[" * depth + b'"x"' + b"]" * depth)
    headers = {"authorization": f"Bearer {ACME}", "content-type": "application/json"}
    r = httpx.post(gw + path, content=raw, headers=headers, timeout=10)
    assert r.status_code == 400, r.text
    envelope = r.json()
    assert envelope["type"] == "error" if path == "/v1/messages" else envelope["error"]["code"] == "invalid_json"


def test_nesting_within_the_bound_is_served(gw: str) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": nested(40, {"type": "object"})}}]
    assert post(gw, "/v1/chat/completions", {**CHAT, "tools": tools}).status_code == 200


# -- keys ---------------------------------------------------------------------------------------------
def test_two_authorization_headers_are_refused_not_last_wins(gw: str) -> None:
    body = orjson.dumps(CHAT)
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
               b"authorization: Bearer " + BETA.encode() + b"\r\nauthorization: Bearer " + ACME.encode() + b"\r\n"
               b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body)
    status, envelope = status_and_body(raw_exchange(gw, request))
    assert status == 400 and envelope["error"]["code"] == "duplicate_credentials"


def test_authorization_and_x_api_key_naming_different_keys_are_refused(gw: str) -> None:
    messages = {"model": PUBLIC_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    r = post(gw, "/v1/messages", messages, **{"x-api-key": BETA})
    assert r.status_code == 400 and r.json()["type"] == "error"
    same = post(gw, "/v1/chat/completions", CHAT, **{"x-api-key": ACME})
    assert same.status_code == 200


# -- cache_salt ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "tenant"), [(ACME, "acme"), (BETA, "beta")])
def test_a_clients_cache_salt_is_namespaced_under_its_tenant_never_forwarded_as_sent(
    gw: str, upstream: tuple[FakeUpstream, str], key: str, tenant: str
) -> None:
    forged = cache_salt_for("acme", DEFAULT_SECRET)  # what a client could compute from a tenant id on /metrics
    assert post(gw, "/v1/chat/completions", {**CHAT, "cache_salt": forged}, key=key).status_code == 200
    sent = upstream[0].seen[-1]["cache_salt"]
    assert sent == client_salt(tenant, DEFAULT_SECRET, forged) and sent != forged


# -- control paths ------------------------------------------------------------------------------------
def test_metrics_and_docs_need_an_admin_key_when_configured(gw: str) -> None:
    for path in ("/metrics", "/docs", "/openapi.json"):
        assert httpx.get(gw + path).status_code == 401
        assert httpx.get(gw + path, headers={"authorization": f"Bearer {ACME}"}).status_code == 403
        assert httpx.get(gw + path, headers={"authorization": f"Bearer {ADMIN}"}).status_code == 200
    assert httpx.get(gw + "/health").status_code == 200 and httpx.get(gw + "/v1/models").status_code == 200


def test_by_default_metrics_are_open_and_docs_need_an_admin_key(upstream: tuple[FakeUpstream, str]) -> None:
    with running_gateway(gateway_config([upstream[1]])) as url:
        assert httpx.get(url + "/metrics").status_code == 200
        assert httpx.get(url + "/openapi.json").status_code == 401


# -- forwarded-for ------------------------------------------------------------------------------------
def test_a_trusted_proxys_connections_count_per_forwarded_client(upstream: tuple[FakeUpstream, str]) -> None:
    cfg = gateway_config([upstream[1]], listen={"host": "127.0.0.1", "port": free_port(),
                                                "max_connections_per_client": 1, "trusted_proxies": ["127.0.0.0/8"]})
    with running_guarded_gateway(cfg) as url, httpx.Client(base_url=url) as a, httpx.Client(base_url=url) as b, \
            httpx.Client(base_url=url) as c:
        assert a.post("/v1/chat/completions", json=CHAT, headers={"x-forwarded-for": "203.0.113.7"}).status_code == 200
        # Another client behind the same proxy address: its own allowance.
        assert b.post("/v1/chat/completions", json=CHAT, headers={"x-forwarded-for": "203.0.113.8"}).status_code == 200
        # The first client again, on a second connection while its first is open: over its cap.
        refused = c.post("/v1/chat/completions", json=CHAT, headers={"x-forwarded-for": "198.51.100.1, 203.0.113.7"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "too_many_connections"


def test_the_client_is_the_rightmost_untrusted_hop_and_untrusted_peers_are_themselves() -> None:
    addresses = ClientAddresses.from_listen(Listen(trusted_proxies=["10.0.0.0/8"]))
    hops = [(b"x-forwarded-for", b"6.6.6.6, 192.0.2.1, 10.1.1.1")]
    assert addresses.client_of("10.0.0.5", hops) == "192.0.2.1"
    assert addresses.client_of("192.0.2.9", hops) == "192.0.2.9"  # not a proxy: its header is not believed
    assert addresses.client_of("10.0.0.5", []) == "10.0.0.5"


# -- the salt secret ----------------------------------------------------------------------------------
def test_the_default_salt_secret_is_refused_off_loopback_naming_the_key() -> None:
    assert salt_secret_problem(DEFAULT_SECRET, "127.0.0.1") is None
    assert salt_secret_problem(DEFAULT_SECRET, "::1") is None
    assert salt_secret_problem("my-own-secret", "0.0.0.0") is None
    problem = salt_secret_problem(DEFAULT_SECRET, "0.0.0.0")
    assert problem is not None and "normalize.salt_secret" in problem and "KVGATE_NORMALIZE__SALT_SECRET" in problem


def test_the_salt_modules_default_is_the_configs() -> None:
    from app.config.models import NormalizeConfig

    assert NormalizeConfig().salt_secret == DEFAULT_SECRET


# -- stored responses ---------------------------------------------------------------------------------
def test_another_tenants_stored_response_is_404_to_get_cancel_and_continue() -> None:
    with running_sim(model="served-model", enable_responses_store=True) as sim:
        cfg = gateway_config([sim], tenants=TENANTS, auth={"required": True})
        with running_gateway(cfg) as url:
            made = post(url, "/v1/responses", {"model": PUBLIC_MODEL, "input": "Remember 7.", "max_output_tokens": 4})
            rid = made.json()["id"]
            own = {"authorization": f"Bearer {ACME}"}
            assert httpx.get(f"{url}/v1/responses/{rid}", headers=own).status_code == 200
            other = {"authorization": f"Bearer {BETA}"}
            got = httpx.get(f"{url}/v1/responses/{rid}", headers=other)
            assert got.status_code == 404 and got.json()["error"]["code"] == "response_not_found"
            assert httpx.post(f"{url}/v1/responses/{rid}/cancel", headers=other).status_code == 404
            follow = post(url, "/v1/responses", {"model": PUBLIC_MODEL, "input": "Which number?",
                                                 "max_output_tokens": 4, "previous_response_id": rid}, key=BETA)
            assert follow.status_code == 404
