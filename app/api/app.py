"""The ASGI application: FastAPI for the control surface, raw ASGI endpoints for inference."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.admin import admin_router
from app.api.proxy import InferenceEndpoint
from app.api.stored_responses import PREFIX as STORED_PREFIX
from app.api.stored_responses import StoredResponseEndpoint
from app.api.surfaces import SURFACES
from app.config import GatewayConfig
from app.errors import error_body
from app.pipeline import Gateway


class _OrjsonResponse(JSONResponse):
    def render(self, content: object) -> bytes:
        return orjson.dumps(content)


class GatewayApp:
    """The ASGI entry: inference paths go straight to their raw endpoint, the rest to FastAPI.

    FastAPI's middleware stack and router cost tens of µs per request; the hot path needs none of it.
    """

    def __init__(self, api: FastAPI, inference: ASGIApp, paths: frozenset[str], stored: ASGIApp) -> None:
        self.api = api
        self._inference = inference
        self._paths = paths
        self._stored = stored

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Dispatch one ASGI connection."""
        if scope["type"] == "http" and scope["path"] in self._paths:
            await self._inference(scope, receive, send)
        elif scope["type"] == "http" and scope["path"].startswith(STORED_PREFIX):
            await self._stored(scope, receive, send)
        else:
            await self.api(scope, receive, send)


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

    def gateway() -> Gateway:
        return gw

    app.include_router(admin_router(gw.registry, gw.store, cfg.auth.admin_keys))

    endpoint = InferenceEndpoint(gateway)

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
        """Ready when every model has at least one healthy replica."""
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

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        body = error_body(str(first.get("msg", "invalid request")), "invalid_request_error", param, None)
        return Response(body, status_code=400, media_type="application/json")

    return GatewayApp(app, endpoint, frozenset(SURFACES), StoredResponseEndpoint(gateway))
