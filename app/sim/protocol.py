"""Request parsing and validation for the sim's OpenAI endpoints, with vLLM's error bodies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from app.sim.chat import BuiltinChat, ChatPrompt
from app.sim.template import TemplateError
from app.sim.tokenizer import Tokenizer

MAX_CACHE_SALT_LENGTH = 128
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


class SimHTTPError(Exception):
    """An error answered with vLLM's envelope `{"error": {message, type, param, code}}`."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> bytes:
        """The JSON body vLLM sends."""
        return orjson.dumps(
            {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}
        )


def _validation_error(msg: str, param: str, value: Any = None, *, with_value: bool = False) -> SimHTTPError:
    # vLLM 0.32 turns a VLLMValidationError into BadRequestError with "(parameter=..[, value=..])" appended.
    suffix = f" (parameter={param}, value={value})" if with_value else f" (parameter={param})"
    return SimHTTPError(400, msg + suffix, "BadRequestError", param)


def json_decode_error(raw: bytes) -> SimHTTPError:
    """The body vLLM (FastAPI) sends for malformed JSON; pydantic's message, Python json's position and reason."""
    import json

    try:
        json.loads(raw)
        reason, pos = "Invalid JSON", 0
    except json.JSONDecodeError as e:
        reason, pos = e.msg, e.pos
    except (UnicodeDecodeError, ValueError):
        reason, pos = "Invalid JSON", 0
    detail = {"type": "json_invalid", "loc": f"body.{pos}", "msg": "JSON decode error",
              "input": "<dict of 0 items>", "ctx": {"error": reason}}
    return SimHTTPError(400, f"1 validation error:\n  {detail}", "Bad Request", f"body.{pos}")


def validate_cache_salt(body: dict[str, Any]) -> str | None:
    """vLLM's validate_cache_salt: a non-empty string, at most 128 characters, none of `@ / \\` or NUL."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise _validation_error("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(salt) > MAX_CACHE_SALT_LENGTH or any(ch in CACHE_SALT_FORBIDDEN for ch in salt):
        raise _validation_error(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        )
    return salt


def check_tool_choice(body: dict[str, Any], *, auto_tool_choice: bool, tool_parser: str | None) -> None:
    """vLLM refuses tool calling it was not started for (--enable-auto-tool-choice, --tool-call-parser)."""
    if not body.get("tools"):
        return
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return
    if choice in (None, "auto"):
        if not (auto_tool_choice and tool_parser):
            raise SimHTTPError(
                400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
    elif not tool_parser:
        if choice == "required":
            raise SimHTTPError(400, 'tool_choice="required" requires --tool-call-parser to be set')
        name = choice.get("function", {}).get("name") if isinstance(choice, dict) else choice
        raise SimHTTPError(400, f'tool_choice=function "{name}" requires --tool-call-parser to be set')


@dataclass(slots=True)
class GenRequest:
    """A parsed generation request."""

    kind: str  # "chat" | "completion"
    prompt_ids: list[int]
    n: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool
    seed: int | None
    priority: int
    salt: str | None
    echo_prompt: str | None  # completions with echo=true
    # The open assistant turn's tokens under continue_final_message: a seeded sequence that began with them
    # resumes after them (the engine's resume), as a deterministic model continues its own text.
    resume_ids: tuple[int, ...] = ()


def _int_field(body: dict[str, Any], name: str, default: int | None, lo: int | None = None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise SimHTTPError(400, f"{name} must be an integer", "BadRequestError", name)
    if lo is not None and v < lo:
        raise SimHTTPError(400, f"{name} must be at least {lo}, got {v}.", "BadRequestError", name)
    return v


def open_turn_ids(tokenizer: Tokenizer, messages: list[Any]) -> tuple[int, ...]:
    """The tokens of a final assistant turn left open for continuation (empty when there is none)."""
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant" or not isinstance(last.get("content"), str):
        return ()
    return tuple(tokenizer.encode(last["content"], add_special_tokens=False))


def parse_generation(
    kind: str,
    body: Any,
    *,
    tokenizer: Tokenizer,
    served_model: str,
    max_model_len: int,
    priority_enabled: bool,
    header_priority: str | None,
    default_system: str | None,
    render_tools: bool = True,
    auto_tool_choice: bool = False,
    tool_parser: str | None = None,
    chat: ChatPrompt | None = None,
) -> GenRequest:
    """Validate a chat or completion body the way vLLM's OpenAI server does, and tokenize its prompt."""
    if not isinstance(body, dict):
        raise SimHTTPError(400, "Expected a JSON object", "Bad Request", None)
    model = body.get("model")
    if model is not None and model != served_model:
        raise SimHTTPError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {served_model}.",
            "NotFoundError",
            "model",
        )
    salt = validate_cache_salt(body)
    stream = bool(body.get("stream", False))
    opts = body.get("stream_options")
    if opts is not None and not stream:
        raise _validation_error("Stream options can only be defined when `stream=True`.", "stream_options")
    opts = opts if isinstance(opts, dict) else {}
    echo: str | None = None
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise SimHTTPError(400, "Field required: messages", "Bad Request", "messages")
        check_tool_choice(body, auto_tool_choice=auto_tool_choice, tool_parser=tool_parser)
        if chat is None:
            chat = BuiltinChat(tokenizer, default_system=default_system, render_tools=render_tools)
        try:
            prompt_ids = chat.token_ids(body)
        except TemplateError as e:
            raise SimHTTPError(400, str(e), "BadRequestError", "messages") from None
        max_tok = body.get("max_completion_tokens")
        if max_tok is None:
            max_tok = body.get("max_tokens")
        resume = open_turn_ids(tokenizer, messages) if body.get("continue_final_message") else ()
    else:
        prompt = body.get("prompt")
        if prompt is None or prompt == "" or prompt == []:
            raise _validation_error("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            # vLLM's completions default is add_special_tokens=True (a BOS where the tokenizer defines one).
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=body.get("add_special_tokens", True) is not False)
            if body.get("echo"):
                echo = prompt
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise SimHTTPError(400, "The sim accepts one prompt per request", "BadRequestError", "prompt")
        max_tok = body.get("max_tokens", 16)  # OpenAI completions default
        resume = ()
    n = _int_field(body, "n", 1)
    if n is None or n < 1:
        raise SimHTTPError(400, f"n must be at least 1, got {n}.", "BadRequestError", None)
    if max_tok is not None and (isinstance(max_tok, bool) or not isinstance(max_tok, int)):
        raise SimHTTPError(400, "max_tokens must be an integer", "Bad Request", "max_tokens")
    if max_tok is not None and max_tok > max_model_len:
        raise _validation_error(
            f"max_tokens={max_tok} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_tokens",
            max_tok,
            with_value=True,
        )
    if len(prompt_ids) > max_model_len:
        raise _validation_error(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{len(prompt_ids)} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt.",
            "input_tokens",
            len(prompt_ids),
            with_value=True,
        )
    # vLLM clamps max_tokens to the room left in the context rather than refusing.
    room = max_model_len - len(prompt_ids)
    max_tokens = room if max_tok is None else min(max_tok, room)
    if max_tokens < 1:
        raise _validation_error(
            f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens, with_value=True
        )
    priority = _int_field(body, "priority", 0) or 0
    if header_priority is not None and "priority" not in body:
        try:
            priority = int(header_priority)
        except ValueError:
            raise SimHTTPError(400, "X-Vllm-Priority must be an integer", "BadRequestError", "priority") from None
    if not priority_enabled:
        priority = 0  # vLLM accepts a priority under FCFS and ignores it
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise SimHTTPError(400, "seed must be an integer", "BadRequestError", "seed")
    return GenRequest(
        kind=kind,
        prompt_ids=prompt_ids,
        n=n,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(opts.get("include_usage", False)),
        continuous_usage=bool(opts.get("continuous_usage_stats", False)),
        ignore_eos=bool(body.get("ignore_eos", False)),
        seed=seed,
        priority=priority,
        salt=salt,
        echo_prompt=echo,
        resume_ids=resume,
    )
