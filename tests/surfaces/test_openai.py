"""Upstream helpers: model-name rewrite by bytes, usage capture, which SSE chunks need parsing."""

from __future__ import annotations

from app.context import Usage
from app.surfaces.openai import capture_usage, rewrite_model
from app.surfaces.openai import plain_token_chunk as _plain_token_chunk

TOKEN = (b'data: {"id":"c","object":"chat.completion.chunk","model":"served","choices":[{"index":0,'
         b'"delta":{"content":"hi"},"logprobs":null,"finish_reason":null}]}\n\n')
LAST = TOKEN.replace(b'"finish_reason":null', b'"finish_reason":"stop"')
USAGE = (b'data: {"id":"c","object":"chat.completion.chunk","model":"served","choices":[],'
         b'"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}\n\n')


def test_token_chunks_skip_parsing_but_finish_usage_and_errors_do_not() -> None:
    assert _plain_token_chunk(TOKEN)
    assert not _plain_token_chunk(LAST)
    assert not _plain_token_chunk(USAGE)
    assert not _plain_token_chunk(b'data: {"error":{"message":"x"}}\n\n')


def test_rewrite_model_touches_only_the_model_field() -> None:
    out = rewrite_model(TOKEN, "served", "public")
    assert b'"model":"public"' in out and b"served" not in out
    assert rewrite_model(TOKEN, "same", "same") is TOKEN


def test_capture_usage_reads_cached_tokens() -> None:
    usage = Usage()
    capture_usage({"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 8}}, usage)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.uncached_tokens) == (10, 4, 8, 2)
    assert usage.reported


def test_capture_usage_ignores_missing_usage() -> None:
    usage = Usage()
    capture_usage(None, usage)
    assert not usage.reported
