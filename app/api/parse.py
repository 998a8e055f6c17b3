"""The api stage: turn raw bytes into a validated RequestContext, or an OpenAI-style 4xx."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from app.config import GatewayConfig
from app.context import Operation, RequestContext
from app.errors import GatewayError, bad_request

OPERATIONS: dict[str, Operation] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}
_MAX_REQUEST_ID = 128


def request_id_from(headers: Mapping[str, str]) -> str:
    """The client's x-request-id when it is sane, else a fresh one."""
    rid = headers.get("x-request-id", "")
    if 0 < len(rid) <= _MAX_REQUEST_ID and rid.isprintable() and " " not in rid:
        return rid
    return uuid.uuid4().hex


def _positive_int(body: Mapping[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"'{key}' must be a positive integer", param=key)


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise bad_request(f"'{key}' must be a number between {lo:g} and {hi:g}", param=key)


def _validate_chat(body: Mapping[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be an array", param="tools")
    _positive_int(body, "max_completion_tokens")


def _validate_completion(body: Mapping[str, Any]) -> None:
    prompt = body.get("prompt")
    if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
        raise bad_request("'prompt' must be a string or a non-empty array", param="prompt")


def _validate_embeddings(body: Mapping[str, Any]) -> None:
    value = body.get("input")
    if not isinstance(value, str | list) or (isinstance(value, list) and not value):
        raise bad_request("'input' must be a string or a non-empty array", param="input")


_VALIDATORS = {"chat": _validate_chat, "text_completion": _validate_completion, "embeddings": _validate_embeddings}


def parse_request(
    path: str, raw: bytes, headers: dict[str, str], cfg: GatewayConfig, request_id: str
) -> RequestContext:
    """Validate an inference request body and build its context; raises GatewayError (400/404)."""
    started = time.perf_counter()
    operation = OPERATIONS[path]
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
        raise GatewayError(
            404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
        )
    _VALIDATORS[operation](body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    if operation == "embeddings" and stream:
        raise bad_request("embeddings cannot be streamed", param="stream")
    _positive_int(body, "max_tokens")
    _positive_int(body, "n")
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    wants_usage = False
    if stream:
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise bad_request("'stream_options' must be an object", param="stream_options")
        wants_usage = bool(options and options.get("include_usage"))
        # Always ask for the usage chunk: limits and cost need the numbers on streams too.
        body["stream_options"] = {**(options or {}), "include_usage": True}
    ctx = RequestContext(
        request_id=request_id,
        operation=operation,
        path=path,
        body=body,
        model=model,
        stream=stream,
        client_wants_usage=wants_usage,
        headers=headers,
    )
    ctx.timing.start = started
    return ctx
