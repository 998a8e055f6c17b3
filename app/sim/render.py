"""vLLM 0.32's render answers (POST /v1/chat/completions/render, /v1/completions/render): a GenerateRequest.

vLLM (vllm/entrypoints/scale_out/render/serving.py) renders and tokenizes the body exactly as generation would,
then returns the token-in request it would hand the engine: `request_id`, `token_ids`, the resolved
`sampling_params` and the routing fields (stream, cache_salt, priority). Routers such as the vLLM router's
cache_aware policy call it for every request to learn the token ids. The sim answers from the same parse as
its generation endpoints, so the ids equal what the engine then caches.

`sampling_params` is vLLM's msgspec SamplingParams as pydantic dumps it (omit_defaults): the keys below appear
exactly when vLLM shows them (tests/sim/fixtures/vllm_render.json, generated with vLLM's own classes).
"""

from __future__ import annotations

from typing import Any

from app.sim.protocol import GenRequest

OUTPUT_KIND_DELTA = 1  # RequestOutputKind.DELTA: streaming
OUTPUT_KIND_FINAL_ONLY = 2
SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: below it, sampling is greedy
SAMPLING_DEFAULT_MAX_TOKENS = 16  # SamplingParams.max_tokens default (then omitted from the dump)


def _num(body: dict[str, Any], name: str, default: float) -> float:
    v = body.get(name)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


def sampling_params(kind: str, body: dict[str, Any], gen: GenRequest) -> dict[str, Any]:
    """The request's SamplingParams as vLLM's render endpoint dumps them, in SamplingParams field order."""
    sp: dict[str, Any] = {}
    if gen.n != 1:
        sp["n"] = gen.n
    sp["presence_penalty"] = _num(body, "presence_penalty", 0.0)
    sp["frequency_penalty"] = _num(body, "frequency_penalty", 0.0)
    sp["repetition_penalty"] = _num(body, "repetition_penalty", 1.0)
    temperature = _num(body, "temperature", 1.0)
    sp["temperature"] = temperature
    if temperature >= SAMPLING_EPS:  # greedy sampling resets top_p/top_k/min_p to their defaults
        sp["top_p"] = _num(body, "top_p", 1.0)
        top_k = body.get("top_k")
        if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k not in (0, -1):
            sp["top_k"] = top_k
        sp["min_p"] = _num(body, "min_p", 0.0)
    if gen.seed is not None:
        sp["seed"] = gen.seed
    stop = body.get("stop")
    sp["stop"] = [stop] if isinstance(stop, str) else list(stop or [])
    sp["stop_token_ids"] = list(body.get("stop_token_ids") or [])
    if gen.ignore_eos:
        sp["ignore_eos"] = True
    if gen.max_tokens != SAMPLING_DEFAULT_MAX_TOKENS:
        sp["max_tokens"] = gen.max_tokens
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool) and min_tokens:
        sp["min_tokens"] = min_tokens
    if kind == "chat":
        logprobs = body.get("top_logprobs", 0) if body.get("logprobs") else None
    else:
        logprobs = body.get("logprobs")
    if logprobs is not None:
        sp["logprobs"] = logprobs
    if body.get("skip_special_tokens") is False:
        sp["skip_special_tokens"] = False
    if body.get("spaces_between_special_tokens") is False:
        sp["spaces_between_special_tokens"] = False
    if body.get("include_stop_str_in_output") is True:
        sp["include_stop_str_in_output"] = True
    sp["output_kind"] = OUTPUT_KIND_DELTA if gen.stream else OUTPUT_KIND_FINAL_ONLY
    sp["skip_clone"] = True
    for name in ("logit_bias", "allowed_token_ids"):
        if body.get(name):
            sp[name] = body[name]
    sp["bad_words"] = list(body.get("bad_words") or [])
    sp["skip_reading_prefix_cache"] = False
    return sp


def generate_request(kind: str, body: dict[str, Any], gen: GenRequest, request_id: str) -> dict[str, Any]:
    """One GenerateRequest dump (model_dump(mode="json") key order) for a parsed chat or completion body."""
    opts = body.get("stream_options") if gen.stream else None
    stream_options = None
    if isinstance(opts, dict):
        stream_options = {
            "include_usage": opts.get("include_usage", False),
            "continuous_usage_stats": opts.get("continuous_usage_stats", False),
        }
    out: dict[str, Any] = {
        "request_id": request_id,
        "token_ids": gen.prompt_ids,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": sampling_params(kind, body, gen),
        "model": body.get("model"),
    }
    if kind == "chat":
        out["reasoning_ended"] = None if body.get("include_reasoning", True) else True
    else:
        out["reasoning_ended"] = None
    out.update(
        {
            "reasoning_parser_kwargs": None,
            "return_token_ids": None,
            "output_mode": "tokens",
            "stream": gen.stream,
            "stream_options": stream_options,
            "cache_salt": gen.salt,
            # The engine ignores a priority under FCFS, but the render echoes what the request asked for.
            "priority": body["priority"] if isinstance(body.get("priority"), int) else gen.priority,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
        }
    )
    return out
