"""The ASGI application: FastAPI for the control surface, raw ASGI endpoints for inference."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.admin import admin_router
from app.api.parse import request_id_from
from app.api.proxy import InferenceEndpoint, headers_of, internal_error, send_reply
from app.api.server import ConnectionGuard, register_connection_metrics
from app.api.stored_responses import PREFIX as STORED_PREFIX
from app.api.stored_responses import StoredResponseEndpoint
from app.config import GatewayConfig
from app.errors import error_body
from app.gateway import Gateway
from app.headers import REQUEST_ID
from app.reply import Reply
from app.surfaces import SURFACES

log = logging.getLogger(__name__)


class _OrjsonResponse(JSONResponse):
    def render(self, content: object) -> bytes:
        return orjson.dumps(content)


class GatewayApp:
    """The ASGI entry: inference paths go straight to their raw endpoint, the rest to FastAPI.

    FastAPI's middleware stack and router cost tens of µs per request; the hot path needs none of it.
    """

    def __init__(
        self, api: FastAPI, inference: ASGIApp, paths: frozenset[str], stored: ASGIApp, connections: ConnectionGuard
    ) -> None:
        self.api = api
        self._inference = inference
        self._paths = paths
        self._stored = stored
        # The server's protocol (app/api/server.py) counts into it; /metrics reads it.
        self.connections = connections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Dispatch one ASGI connection."""
        if scope["type"] == "http" and scope["path"] in self._paths:
            await self._inference(scope, receive, send)
        elif scope["type"] == "http" and scope["path"].startswith(STORED_PREFIX):
            await _enveloped(self._stored, scope, receive, send)
        else:
            await self.api(scope, receive, send)

    def begin_drain(self) -> None:
        """The server is shutting down: /ready answers 503 from now on."""
        self.api.state.draining = True


async def _enveloped(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run a raw endpoint; an exception before its answer started becomes a 500 in OpenAI's envelope."""
    started = False

    async def tracked(message: Message) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, receive, tracked)
    except Exception:
        rid = request_id_from(headers_of(scope))
        log.exception("request %s: failed on %s", rid, scope["path"])
        if started:
            raise
        await send_reply(send, Reply(500, {"content-type": "application/json", REQUEST_ID: rid},
                                     internal_error(rid).body()), lambda: None)  # fmt: skip


def create_app(cfg: GatewayConfig) -> GatewayApp:
    """Build the gateway app; long-lived state is created in the lifespan and kept on app.state."""

    gw = Gateway(cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(title="kvgate", version="0.1.0", lifespan=lifespan, default_response_class=_OrjsonResponse)
    started = int(time.time())

    app.state.gateway = gw
    app.state.draining = False
    connections = ConnectionGuard.from_listen(cfg.listen)
    register_connection_metrics(gw.telemetry.meter, connections.stats)

    def gateway() -> Gateway:
        return gw

    app.include_router(admin_router(gw.registry, gw.store, cfg.auth.admin_keys))

    endpoint = InferenceEndpoint(gateway, connections.stats)

    cards = {m.name: {"id": m.name, "object": "model", "created": started, "owned_by": "kvgate"} for m in cfg.models}

    @app.get("/v1/models")
    async def list_models() -> dict[str, object]:
        """The public model names from the config."""
        return {"object": "list", "data": list(cards.values())}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> Response:
        """One model, as /v1/models lists it (vLLM 0.32 has no such route: the gateway answers from its config)."""
        card = cards.get(model_id)
        if card is None:
            body = error_body(f"The model `{model_id}` does not exist.", "invalid_request_error", "model",
                              "model_not_found")  # fmt: skip
            return Response(body, status_code=404, media_type="application/json")
        return _OrjsonResponse(card)

    @app.get("/health")
    async def health() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        """Ready when every model has at least one healthy replica, and not draining."""
        if app.state.draining:
            return _OrjsonResponse({"status": "draining"}, status_code=503)
        missing = gateway().unready_models()
        if missing:
            return _OrjsonResponse({"status": "unready", "models_without_replica": missing}, status_code=503)
        return _OrjsonResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text of the gateway's own metrics."""
        # Rendering takes tens of ms at a thousand series: keep it off the event loop.
        body, content_type = await asyncio.to_thread(gateway().render_metrics)
        return Response(body, media_type=content_type)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        body = error_body(str(exc.detail), kind, None, None)
        return Response(body, status_code=exc.status_code, media_type="application/json")

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> Response:
        # Starlette logs and re-raises after this answer; the client gets the envelope, not a text body.
        rid = request_id_from(request.headers)
        log.error("request %s: failed on %s", rid, request.url.path)
        return Response(internal_error(rid).body(), status_code=500, media_type="application/json",
                        headers={REQUEST_ID: rid})  # fmt: skip

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        body = error_body(str(first.get("msg", "invalid request")), "invalid_request_error", param, None)
        return Response(body, status_code=400, media_type="application/json")

    return GatewayApp(app, endpoint, frozenset(SURFACES), StoredResponseEndpoint(gateway), connections)
