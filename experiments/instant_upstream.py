"""An instant OpenAI-compatible upstream for overhead benchmarks: canned answers, `max_tokens` chunks per stream.

Run: python experiments/instant_upstream.py PORT   (raw ASGI on uvicorn+httptools; no framework cost of its own)
"""

from __future__ import annotations

import sys

import orjson
import uvicorn

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


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    """Answer instantly: a whole completion, or an SSE stream of max_tokens chunks."""
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
    doc = orjson.loads(body)
    if not doc.get("stream"):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": _COMPLETE})
        return
    n = int(doc.get("max_tokens") or 16)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(n - 1):
        await send({"type": "http.response.body", "body": _CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": _LAST, "more_body": True})
    if (doc.get("stream_options") or {}).get("include_usage"):
        await send({"type": "http.response.body", "body": _USAGE % (40 + n, n), "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
                access_log=False, log_level="error")
