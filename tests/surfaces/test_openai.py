"""Upstream helpers: model-name rewrite by bytes, usage capture, which SSE chunks need parsing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.context import RequestContext, Usage
from app.surfaces import CHAT
from app.surfaces.openai import ChunkObserver, capture_usage, rewrite_model
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


# -- the hot path's inlined twin: ChunkObserver.observe runs plain_token_chunk() inlined ---------------------
_KEYS = st.sampled_from([b'"finish_reason":null', b'"finish_reason": null', b'"finish_reason":"stop"',
                         b'"usage":null', b'"usage":{"prompt_tokens":1}', b'"usage" :null', b'"error":{"m":1}',
                         b'"content":"finish_reason"', b'"logprobs":null'])  # fmt: skip


class _ReferenceObserver(ChunkObserver):
    """The observer as written before the inlining: the fast path calls plain_token_chunk()."""

    def observe(self, event: bytes) -> bytes | None:
        if (event.startswith((b"data: {", b"data:{")) and self._ctx.timing.first_token
                and _plain_token_chunk(event)):  # fmt: skip
            self.delivered += 1
            return event
        return self._parsed(event)


def _outcome(cls: type[ChunkObserver], event: bytes) -> tuple[object, ...]:
    ctx = RequestContext(request_id="r", surface=CHAT, path="/v1/chat/completions", body={}, model="served",
                         stream=True, client_wants_usage=True, headers={})  # fmt: skip
    ctx.timing.first_token = 1.0  # past the first token: the fast path is open
    observer = cls(ctx, "served")
    try:
        out: object = observer.observe(event)
    except Exception as err:
        out = type(err)
    return out, observer.delivered, observer.done, ctx.finish_reasons, ctx.usage, ctx.error_type


@given(st.lists(_KEYS, max_size=4), st.booleans())
def test_the_inlined_fast_path_gives_what_plain_token_chunk_gives(keys: list[bytes], bare: bool) -> None:
    event = (b"data:" if bare else b"data: ") + b'{"id":"c","model":"served","choices":[{"index":0,' + b",".join(
        [b'"delta":{"content":"x"}', *keys]) + b"}]}\n\n"
    assert _outcome(ChunkObserver, event) == _outcome(_ReferenceObserver, event)
