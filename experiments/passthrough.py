"""The baseline: a bare Starlette + aiohttp pass-through proxy (what any gateway costs at minimum).

Run: python experiments/passthrough.py PORT UPSTREAM_URL
"""

from __future__ import annotations

import contextlib
import sys

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

UPSTREAM = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:9000"
state: dict[str, aiohttp.ClientSession] = {}


async def proxy(request: Request) -> Response:
    """Forward the body; relay the answer, streaming when the upstream streams."""
    body = await request.body()
    resp = await state["s"].post(UPSTREAM + request.url.path, data=body,
                                 headers={"content-type": "application/json"})
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        async def relay():  # type: ignore[no-untyped-def]
            async for chunk in resp.content.iter_any():
                yield chunk
            resp.release()
        return StreamingResponse(relay(), media_type="text/event-stream")
    data = await resp.read()
    resp.release()
    return Response(data, status_code=resp.status, media_type="application/json")


@contextlib.asynccontextmanager
async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
    state["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    yield
    await state["s"].close()


# Any path relays the same way; experiments/peers.py also sends the Responses and Messages surfaces.
app = Starlette(routes=[Route(path, proxy, methods=["POST"])
                        for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages")], lifespan=lifespan)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
                access_log=False, log_level="error")
