"""The api stage: raw bytes → a validated RequestContext (through the path's surface), or a 4xx."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import orjson

from app.config import GatewayConfig
from app.context import RequestContext
from app.errors import bad_request, not_found
from app.surfaces import SURFACES, Surface

_MAX_REQUEST_ID = 128


def request_id_from(headers: Mapping[str, str]) -> str:
    """The client's x-request-id when it is sane, else a fresh one."""
    rid = headers.get("x-request-id", "")
    if 0 < len(rid) <= _MAX_REQUEST_ID and rid.isprintable() and " " not in rid:
        return rid
    return uuid.uuid4().hex


def parse_request(
    path: str, raw: bytes, headers: dict[str, str], cfg: GatewayConfig, request_id: str,
    surface: Surface | None = None,
) -> RequestContext:  # fmt: skip
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
