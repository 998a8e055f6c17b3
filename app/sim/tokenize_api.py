"""vLLM 0.32's tokenizer and render endpoints for the sim: /tokenize, /detokenize and the two /render routes.

Shapes follow vllm/entrypoints/serve/tokenize (TokenizeResponse {count, max_model_len, tokens, token_strs},
DetokenizeResponse {prompt}) and vllm/entrypoints/scale_out/render (a GenerateRequest, a list of them for
completions). Chat bodies go through the same ChatPrompt as /v1/chat/completions, so /tokenize and render
give the ids the engine caches (and, with a model folder, the ids a gateway predicts).
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from app.sim.protocol import SimHTTPError, json_decode_error, parse_generation
from app.sim.render import generate_request
from app.sim.state import SimState
from app.sim.template import TemplateError

EMPTY_CONVERSATION = "Cannot apply chat template to an empty conversation. Provide at least one message."
SCALE_OUT_DISABLED = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(e: SimHTTPError) -> Response:
    return Response(e.body(), status_code=e.status, media_type="application/json")


def validation_error(errors: list[dict[str, Any]]) -> SimHTTPError:
    """vLLM's 400 for a pydantic validation failure: its message lists each error, `param` is the first loc."""
    n = len(errors)
    text = f"{n} validation error{'s' if n != 1 else ''}:" + "".join(f"\n  {e}" for e in errors)
    return SimHTTPError(400, text, "Bad Request", errors[0]["loc"])


def _missing(loc: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"type": "missing", "loc": loc, "msg": "Field required", "input": f"<dict of {len(body)} items>"}


def _invalid(kind: str, loc: str, msg: str, value: Any, **ctx: Any) -> SimHTTPError:
    err: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx:
        err["ctx"] = ctx
    return validation_error([err])


async def _object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise json_decode_error(raw) from None
    if not isinstance(body, dict):
        kind = "list" if isinstance(body, list) else type(body).__name__
        size = f"<{kind} of {len(body)} items>" if isinstance(body, list | str) else repr(body)
        raise validation_error([{"type": "model_attributes_type", "loc": "body",
                                 "msg": "Input should be a valid dictionary or object to extract fields from",
                                 "input": size}])
    return body


def _check_model(st: SimState, body: dict[str, Any]) -> None:
    model = body.get("model")
    served = st.options.model
    if model is not None and model != served:
        raise SimHTTPError(404, f"The model `{model}` does not exist. Valid aliases: {served}.", "NotFoundError",
                           "model")


class TokenizeApi:
    """The four endpoints over one SimState."""

    def __init__(self, state: SimState) -> None:
        self.state = state

    async def tokenize(self, request: Request) -> Response:
        """POST /tokenize: a chat body (`messages`) or a prompt; ids as the generation endpoints compute them."""
        st = self.state
        try:
            body = await _object(request)
            if "messages" not in body and "prompt" not in body:
                raise validation_error([_missing("body.prompt", body), _missing("body.messages", body)])
            _check_model(st, body)
            if "messages" in body:
                if body.get("continue_final_message") and body.get("add_generation_prompt"):
                    raise SimHTTPError(
                        400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                    )
                if body["messages"] == []:
                    raise SimHTTPError(400, EMPTY_CONVERSATION)
                try:
                    ids = st.chat.token_ids(body)
                except TemplateError as e:
                    raise SimHTTPError(400, str(e)) from None
            else:
                prompt = body["prompt"]
                if not isinstance(prompt, str):
                    raise _invalid("string_type", "body.prompt", "Input should be a valid string", repr(prompt))
                # vLLM's /tokenize prompt default is add_special_tokens=True (chat: False).
                specials = body.get("add_special_tokens", True) is not False
                ids = st.tokenizer.encode(prompt, add_special_tokens=specials)
        except SimHTTPError as e:
            return _error(e)
        strs = [st.tokenizer.id_to_token(t) for t in ids] if body.get("return_token_strs") else None
        return _json(
            {"count": len(ids), "max_model_len": st.sched_config.max_model_len, "tokens": ids, "token_strs": strs}
        )

    async def detokenize(self, request: Request) -> Response:
        """POST /detokenize: {"prompt": text} for `tokens` (special tokens kept, unknown ids dropped)."""
        st = self.state
        try:
            body = await _object(request)
            tokens = body.get("tokens")
            if tokens is None:
                raise validation_error([_missing("body.tokens", body)])
            if not isinstance(tokens, list):
                raise _invalid("list_type", "body.tokens", "Input should be a valid list", repr(tokens))
            for i, t in enumerate(tokens):
                if isinstance(t, bool) or not isinstance(t, int):
                    raise _invalid("int_type", f"body.tokens.{i}", "Input should be a valid integer", repr(t))
                if t < 0:
                    raise _invalid("greater_than_equal", f"body.tokens.{i}",
                                   "Input should be greater than or equal to 0", str(t), ge=0)
            _check_model(st, body)
        except SimHTTPError as e:
            return _error(e)
        return _json({"prompt": st.tokenizer.decode(tokens)})

    async def render_chat(self, request: Request) -> Response:
        """POST /v1/chat/completions/render: the GenerateRequest /v1/chat/completions would run."""
        return await self._render(request, "chat")

    async def render_completion(self, request: Request) -> Response:
        """POST /v1/completions/render: a one-element list of GenerateRequest."""
        return await self._render(request, "completion")

    async def _render(self, request: Request, kind: str) -> Response:
        st = self.state
        if not st.options.enable_scale_out:
            return _error(SimHTTPError(403, SCALE_OUT_DISABLED, "PermissionDeniedError"))
        try:
            body = await _object(request)
            if kind == "chat" and body.get("messages") == []:
                raise SimHTTPError(400, EMPTY_CONVERSATION)
            prio = request.headers.get("x-vllm-priority")
            gen = parse_generation(
                kind,
                body,
                tokenizer=st.tokenizer,
                served_model=st.options.model,
                max_model_len=st.sched_config.max_model_len,
                priority_enabled=st.sched_config.policy == "priority",
                header_priority=prio,
                default_system=st.default_system,
                render_tools=st.options.render_tools,
                auto_tool_choice=st.options.enable_auto_tool_choice,
                tool_parser=st.options.tool_call_parser,
                chat=st.chat,
            )
        except SimHTTPError as e:
            return _error(e)
        if not gen.prompt_ids:
            return _error(SimHTTPError(400, "No token_ids rendered"))
        rid = request.headers.get("x-request-id") or body.get("request_id") or uuid.uuid4().hex
        out = generate_request(kind, body, gen, ("chatcmpl-" if kind == "chat" else "cmpl-") + str(rid))
        return _json(out if kind == "chat" else [out])
