"""GET /v1/responses/{id} and POST /v1/responses/{id}/cancel: answered by the replica that holds the response."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
from starlette.types import Receive, Scope, Send

from app.api.parse import request_id_from
from app.api.proxy import headers_of, send_reply
from app.errors import GatewayError, not_found
from app.gateway import Gateway
from app.headers import API_KEY, REQUEST_ID
from app.reply import Reply
from app.routing.response_affinity import ResponseRoutes, holder_gone
from app.surfaces.openai import rewrite_model
from app.upstream import forward_headers, transport_error

PREFIX = "/v1/responses/"
STORED_PATHS = (f"{PREFIX}{{id}}", f"{PREFIX}{{id}}/cancel")  # GET, POST: what __call__ answers


class StoredResponseEndpoint:
    """Looks the response id up in the Store and relays the holder's answer (model name made public)."""

    def __init__(self, gateway: Callable[[], Gateway]) -> None:
        self._gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One lookup or cancel; errors in OpenAI's envelope."""
        headers = headers_of(scope)
        request_id = request_id_from(headers)
        try:
            reply = await self._answer(scope, headers, request_id)
        except GatewayError as err:
            reply = Reply(err.status, {"content-type": "application/json", REQUEST_ID: request_id, **err.headers},
                          err.body())  # fmt: skip
        await send_reply(send, reply, lambda: None)

    async def _answer(self, scope: Scope, headers: dict[str, str], request_id: str) -> Reply:
        gw = self._gateway()
        rest = scope["path"][len(PREFIX) :]
        response_id, _, action = rest.partition("/")
        method = scope["method"]
        if not response_id or (action, method) not in {("", "GET"), ("cancel", "POST")}:
            raise not_found(f"Unknown path {scope['path']} ({method}).", code="unknown_url")
        await gw.registry.resolve(headers.get("authorization"), headers.get(API_KEY))
        holder = ResponseRoutes.usable(response_id, await gw.responses.recall(response_id))
        pool = gw.cluster.pools.get(holder.pool)
        replica = next((r for r in pool.replicas if r.url == holder.replica), None) if pool else None
        if replica is None or not replica.available():
            raise holder_gone(response_id, holder.replica)
        assert gw.session is not None and pool is not None
        url = holder.replica + scope["path"] + (("?" + scope["query_string"].decode()) if scope["query_string"] else "")
        try:
            async with gw.session.request(method, url, headers=forward_headers(request_id)) as resp:
                body = await resp.read()
                content_type = resp.headers.get("content-type", "application/json")
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise transport_error(err, holder.replica) from err
        body = rewrite_model(body, pool.cfg.served_model, holder.model)
        return Reply(status, {"content-type": content_type, REQUEST_ID: request_id}, body)
