"""POST /v1/responses (and GET/cancel of stored responses) as vLLM 0.32 serves them, on the sim's engine.

The input is converted to chat messages the way vLLM's construct_input_messages does (instructions -> a system
turn, a string input -> a user turn, items -> messages), then rendered with the chat template, so the prompt's
tokens and its prefix-cache hits are the chat endpoint's.
vLLM stores responses only with VLLM_ENABLE_RESPONSES_API_STORE=1; the sim's `enable_responses_store` mirrors it
(off: `store` is ignored, GET/cancel/previous_response_id answer 404).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from app.sim.protocol import SimHTTPError, _validation_error, check_tool_choice, open_turn_ids, validate_cache_salt
from app.sim.responses_wire import (
    ResponseEvents,
    ResponseShape,
    echo_reasoning,
    echo_text,
    echo_tool,
    random_id,
    status_of,
    whole_output,
)
from app.sim.state import SimState, send_whole
from app.sim.surface import Job, SurfaceEndpoint, Usage, decode_error, usage_of
from app.sim.template import TemplateError
from app.sim.validation import BodyErrors

STORE_LIMIT = 4096  # vLLM never evicts (it warns of the leak); the sim keeps the newest this many
_SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
_TEXT_PARTS = ("input_text", "output_text", "text")


def _err(status: int, message: str, param: str | None) -> SimHTTPError:
    return SimHTTPError(status, message, "invalid_request_error", param)


def not_found(response_id: str) -> SimHTTPError:
    """vLLM's 404 for an unknown (or unstored) response id."""
    return _err(404, f"Response with id '{response_id}' not found.", "response_id")


def _content(content: Any) -> Any:
    """Responses content parts (input_text/output_text) as the chat template's text parts."""
    if not isinstance(content, list):
        return content
    return [
        {"type": "text", "text": p.get("text", "")} if isinstance(p, dict) and p.get("type") in _TEXT_PARTS else p
        for p in content
    ]


def input_messages(items: list[Any]) -> list[dict[str, Any]]:
    """vLLM's construct_chat_messages_with_tool_call: response items -> chat messages."""
    out: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            raise _validation_error("Unsupported input item type: None", "input")
        kind = item.get("type")
        prev = out[-1] if out and out[-1].get("role") == "assistant" else None
        if kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            if prev is not None:
                prev.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append({"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")})
        elif kind == "reasoning":
            if prev is None or "reasoning" in prev:
                out.append({"role": "assistant", "reasoning": ""})
        elif item.get("role") == "assistant":
            content = item.get("content")
            text = content if isinstance(content, str) else (content[0].get("text") if content else None)
            if prev is not None and prev.get("content") is None:
                prev["content"] = text
            elif text is not None:
                out.append({"role": "assistant", "content": text})
        elif "role" in item:
            out.append({"role": item["role"], "content": _content(item.get("content"))})
        else:
            raise _validation_error(f"Unsupported input item type: {kind}", "input")
    return out


def continues_final_message(inp: Any) -> bool:
    """vLLM's should_continue_final_message: the last input item is a partial (in-progress) assistant turn."""
    if not isinstance(inp, list) or not inp or not isinstance(inp[-1], dict):
        return False
    last = inp[-1]
    return last.get("type", "message") in ("message", "reasoning") and last.get("status") in ("in_progress",
                                                                                             "incomplete")


def chat_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Responses' flat function tools as chat tools (what the template renders)."""
    return [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
        for t in tools
        if isinstance(t, dict) and t.get("type") == "function"
    ]


class ResponsesSurface:
    """The Responses API around the shared engine endpoint; owns the response store."""

    head_first = True

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.store_enabled = state.options.enable_responses_store
        self.responses: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def decode_error(self, raw: bytes) -> SimHTTPError:
        """Malformed JSON."""
        return decode_error(raw)

    def parse(self, body: Any, rid: str, headers: dict[bytes, bytes]) -> Job:
        """Validate as ResponsesRequest does, convert the input and render the prompt."""
        st, opts = self.state, self.state.options
        if not isinstance(body, dict):
            raise SimHTTPError(400, "Expected a JSON object", "Bad Request", None)
        validate_cache_salt(body)
        if body.get("background") and not body.get("store", True):
            raise _validation_error("background can only be used when `store` is true", "background")
        if body.get("prompt") is not None:
            raise _validation_error("prompt template is not supported", "prompt")
        seen = dict(body)
        if not body.get("tools") and body.get("tool_choice", "auto") in ("auto", "none"):
            seen["tool_choice"] = "none"  # a before-validator sets it, so pydantic's errors count it in the input
        v = BodyErrors(seen)
        inp = body.get("input")
        if "input" not in body:
            v.missing("input")
        elif not isinstance(inp, str | list):
            v.add("string_type", "input", "Input should be a valid string", inp)
            v.add("list_type", "input", "Input should be a valid list", inp)
        instructions, model = v.str_("instructions"), v.str_("model")
        max_out, seed, priority = v.int_("max_output_tokens"), v.int_("seed"), v.int_("priority", 0) or 0
        stream, store, background = v.bool_("stream"), v.bool_("store", True), v.bool_("background")
        ignore_eos, prev_id, user = v.bool_("ignore_eos"), v.str_("previous_response_id"), v.str_("user")
        temperature, top_p = v.float_("temperature"), v.float_("top_p")
        tools = v.list_("tools") or []
        tier = body.get("service_tier", "auto")
        if tier not in _SERVICE_TIERS:
            v.add(
                "literal_error",
                "service_tier",
                "Input should be 'auto', 'default', 'flex', 'scale' or 'priority'",
                tier,
            )
        v.raise_if_any()
        tool_choice = body.get("tool_choice", "auto")
        if not tools:
            if tool_choice in ("auto", "none"):
                tool_choice = "none"
            elif tool_choice == "required":
                raise _validation_error(
                    "Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice"
                )
            elif isinstance(tool_choice, dict):
                raise _validation_error("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
        if model is not None and model != opts.model:
            raise SimHTTPError(
                404, f"The model `{model}` does not exist. Valid aliases: {opts.model}.", "NotFoundError", "model"
            )
        if store and not self.store_enabled and background:
            raise _err(
                400,
                "This vLLM engine does not support `store=True` and therefore does not support the "
                "background mode. To enable these features, set the environment variable "
                "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
                "background",
            )
        store = store and self.store_enabled
        messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
        if prev_id is not None:
            prev = self.responses.get(prev_id)
            if prev is None:
                raise not_found(prev_id)
            messages += [m for m in self.messages.get(prev_id, []) if m.get("role") != "system"]
            for item in prev["output"]:
                if item.get("type") == "message":
                    messages += [{"role": "assistant", "content": c.get("text")} for c in item["content"]]
        new = [{"role": "user", "content": inp}] if isinstance(inp, str) else input_messages(inp or [])
        messages += new
        if tools:
            check_tool_choice(
                {
                    "tools": tools,
                    "tool_choice": tool_choice
                    if isinstance(tool_choice, str)
                    else {"function": {"name": tool_choice.get("name")}},
                },
                auto_tool_choice=opts.enable_auto_tool_choice,
                tool_parser=opts.tool_call_parser,
            )
        try:
            cont = continues_final_message(inp)
            resume = open_turn_ids(st.tokenizer, messages) if cont else ()
            ids = st.chat.token_ids({"messages": messages, "tools": chat_tools(tools) if tools else None,
                                     "add_generation_prompt": not cont, "continue_final_message": cont})
        except TemplateError as e:
            raise SimHTTPError(400, str(e), "BadRequestError", None) from None
        max_len = st.sched_config.max_model_len
        if len(ids) >= max_len:
            raise _err(
                400,
                f"The engine prompt length {len(ids)} exceeds the max_model_len {max_len}. Please reduce prompt.",
                "input",
            )
        room = max_len - len(ids)
        max_tokens = room if max_out is None else min(max_out, room)
        if max_tokens < 1:
            raise _validation_error(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        shape = ResponseShape(
            rid=random_id("resp_"),
            created=int(time.time()),
            model=opts.model,
            max_output_tokens=max_tokens,
            instructions=instructions,
            metadata=body.get("metadata"),
            parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
            temperature=1.0 if temperature is None else temperature,
            tool_choice=tool_choice,
            tools=[echo_tool(t) for t in tools],
            top_p=1.0 if top_p is None else top_p,
            background=background,
            max_tool_calls=body.get("max_tool_calls"),
            previous_response_id=prev_id,
            reasoning=echo_reasoning(body.get("reasoning")),
            service_tier=tier,
            text=echo_text(body.get("text")),
            truncation=body.get("truncation") or "disabled",
            user=user,
            presence_penalty=float(body.get("presence_penalty") or 0.0),
            frequency_penalty=float(body.get("frequency_penalty") or 0.0),
        )
        if store:
            self.messages[shape.rid] = messages
        return Job(
            ids,
            max_tokens,
            stream,
            seed=seed,
            ignore_eos=ignore_eos,
            salt=body.get("cache_salt"),
            priority=priority if st.sched_config.policy == "priority" else 0,
            extra={"shape": shape, "store": store, "background": background},
            resume_ids=resume,
        )

    def _remember(self, obj: dict[str, Any]) -> None:
        stored = self.responses.get(obj["id"])
        if stored is not None and stored["status"] == "cancelled":
            return  # vLLM keeps a cancelled response as it was
        self.responses[obj["id"]] = obj
        self.responses.move_to_end(obj["id"])
        while len(self.responses) > STORE_LIMIT:
            old, _ = self.responses.popitem(last=False)
            self.messages.pop(old, None)

    def whole(self, job: Job, text: str, finish_reason: str, usage: Usage) -> bytes:
        """The non-streaming Response."""
        shape: ResponseShape = job.extra["shape"]
        obj = shape.object(
            status_of(finish_reason), whole_output(text, with_parser=bool(self.state.options.tool_call_parser)), usage
        )
        if job.extra["store"]:
            self._remember(obj)
        return orjson.dumps(obj)

    def writer(self, job: Job) -> ResponseEvents:
        """The event writer for a streamed Response."""
        events = ResponseEvents(job.extra["shape"])
        if job.extra["store"]:
            events.on_done = self._remember
        return events

    # ------------------------------------------------------------------ background (store enabled only)
    def start_background(self, job: Job) -> bytes:
        """Queue `job` as a background response: answer `queued` now, store the result when it finishes."""
        shape: ResponseShape = job.extra["shape"]
        queued = shape.object("queued", [], None)
        self._remember(queued)
        engine = self.state.engine
        stream = engine.submit(
            shape.rid,
            job.prompt_ids,
            n=1,
            max_tokens=job.max_tokens,
            seed=job.seed,
            ignore_eos=job.ignore_eos,
            salt=job.salt,
            priority=job.priority,
        )

        async def finish() -> None:
            try:
                while not stream.finished and not stream.closed:
                    await stream.event.wait()
                    stream.drain()
            finally:
                if not stream.finished:
                    engine.abort(stream)
            req = stream.reqs[0]
            self.whole(job, engine.text_of(req, 0, req.num_output), req.finish_reason or "stop", usage_of(req))

        task = asyncio.create_task(finish(), name=f"create_{shape.rid}")
        self.tasks[shape.rid] = task
        task.add_done_callback(lambda _t: self.tasks.pop(shape.rid, None))
        return orjson.dumps(queued)

    async def retrieve(self, request: Request) -> Response:
        """GET /v1/responses/{response_id}."""
        obj = self.responses.get(request.path_params["response_id"])
        if obj is None:
            e = not_found(request.path_params["response_id"])
            return Response(e.body(), status_code=e.status, media_type="application/json")
        return Response(orjson.dumps(obj), media_type="application/json")

    async def cancel(self, request: Request) -> Response:
        """POST /v1/responses/{response_id}/cancel: only a queued/in-progress background response can be."""
        rid = request.path_params["response_id"]
        obj = self.responses.get(rid)
        if obj is None:
            e = not_found(rid)
        elif obj["status"] not in ("queued", "in_progress"):
            e = _err(400, "Cannot cancel a synchronous response.", "response_id")
        else:
            obj["status"] = "cancelled"
            task = self.tasks.get(rid)
            if task is not None:
                task.cancel()
            return Response(orjson.dumps(obj), media_type="application/json")
        return Response(e.body(), status_code=e.status, media_type="application/json")


class ResponsesEndpoint(SurfaceEndpoint):
    """POST /v1/responses: the shared endpoint, plus background mode."""

    surface: ResponsesSurface

    async def run(
        self, job: Job, send: Any, receive: Any, out_headers: list[tuple[bytes, bytes]], accept: float = -1.0
    ) -> None:
        """Background (non-streamed) requests answer `queued` at once; the rest run as usual."""
        if job.extra["background"] and not job.stream:
            await send_whole(send, 200, self.surface.start_background(job), out_headers)
            return
        await super().run(job, send, receive, out_headers, accept)
