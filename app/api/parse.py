"""The api stage: raw bytes → a validated RequestContext (through the path's surface), or a 4xx."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from app.config import GatewayConfig
from app.context import RequestContext
from app.errors import GatewayError, bad_request, not_found
from app.ids import uuid4_hex
from app.surfaces import SURFACES, Surface
from app.tenancy import bearer_token

_MAX_REQUEST_ID = 128
# Deepest nesting of arrays and objects a body may have. orjson reads 1024 levels; the gateway's walkers of
# content (token estimate, prompt view, tool canonicalization, chat rendering) recurse, and 990 levels of a
# chat content, a completions prompt or an embeddings input hit Python's recursion limit (a 500). Real
# bodies nest a few levels (a tool's JSON schema a few dozen at most).
MAX_DEPTH = 64


def too_deep(limit: int = MAX_DEPTH) -> GatewayError:
    """400: nested deeper than the gateway walks."""
    return bad_request(f"The request body is nested more than {limit} levels deep.", code="invalid_json")


def deeper_than(body: Any, raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether `body` nests arrays/objects more than `limit` levels, without recursion.

    A body with at most `limit` brackets cannot nest deeper (two C-speed counts decide most bodies); others are
    walked container by container (strings and numbers are not visited).
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def request_id_from(headers: Mapping[str, str]) -> str:
    """The client's x-request-id when it is sane, else a fresh one."""
    rid = headers.get("x-request-id", "")
    if 0 < len(rid) <= _MAX_REQUEST_ID and rid.isprintable() and " " not in rid:
        return rid
    return uuid4_hex()


def single_credentials(raw_headers: Sequence[tuple[bytes, bytes]], headers: Mapping[str, str] | None = None) -> None:
    """400 unless the request names at most one key: one `Authorization`, one `x-api-key`, and the same key when
    both come. With two, which one a server reads is its own choice (uvicorn's last, a proxy's first): a key the
    gateway did not check could be the one something behind it acts on.

    `headers`, the same headers as a dict with lowercase names (proxy.headers_of), spares the scan of every raw
    header when it holds as many names as there are raw headers: then no name came twice.
    """
    if headers is not None and len(headers) == len(raw_headers):
        auth_value, key_value = headers.get("authorization"), headers.get("x-api-key")
        if auth_value is not None and key_value is not None:
            _same_key(auth_value, key_value)
        return
    auth: list[bytes] = []
    api_key: list[bytes] = []
    for name, value in raw_headers:
        lower = name.lower()
        if lower == b"authorization":
            auth.append(value)
        elif lower == b"x-api-key":
            api_key.append(value)
    if len(auth) > 1 or len(api_key) > 1:
        raise bad_request("The request has more than one Authorization or x-api-key header; send one.",
                          code="duplicate_credentials")
    if auth and api_key:
        _same_key(auth[0].decode("latin-1"), api_key[0].decode("latin-1"))


def _same_key(authorization: str, api_key: str) -> None:
    token = bearer_token(authorization)
    if token is not None and token != api_key.strip():
        raise bad_request("The Authorization and x-api-key headers name different keys; send one.",
                          code="duplicate_credentials")


def parse_request(
    path: str, raw: bytes, headers: dict[str, str], cfg: GatewayConfig, request_id: str,
    surface: Surface | None = None,
) -> RequestContext:
    """Validate an inference request body and build its context; raises GatewayError (400/404)."""
    started = time.perf_counter()
    surface = surface or SURFACES[path]
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request(
            "We could not parse the JSON body of your request. Send a JSON object.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    if deeper_than(body, raw):
        raise too_deep()
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("you must provide a model parameter", param="model")
    if cfg.model(model) is None:
        raise not_found(f"The model `{model}` does not exist.", param="model", code="model_not_found")
    parsed = surface.validate(body)
    ctx = RequestContext(
        request_id=request_id,
        surface=surface,
        path=path,
        body=body,
        model=model,
        stream=parsed.stream,
        client_wants_usage=parsed.client_wants_usage,
        headers=headers,
        prompt=surface.view(body),
    )
    ctx.timing.start = started
    return ctx
