"""Stored responses live on the replica that made them: remember response id → replica, route back to it.

A Responses request with `previous_response_id`, and GET / cancel of a stored response, must reach that
replica (vLLM keeps the response in its own process). The mapping goes to the Store (Redis when configured,
so any gateway replica can route it) with a bounded lifetime; the replica's URL is all that is kept, with the
tenant that made the response: vLLM answers any caller who names an id, so the gateway is what keeps one
tenant from reading (or continuing, or cancelling) another's. Another tenant gets the same 404 as an unknown
id. Anonymous callers are one tenant ("anonymous") and share their responses.
"""

from __future__ import annotations

import hmac
import logging
from typing import NamedTuple

from app.errors import GatewayError
from app.store.base import Store, StoreUnavailable

log = logging.getLogger(__name__)
_PREFIX = "resp:"


class Holder(NamedTuple):
    """Where a stored response lives, the public model name it was asked under, and whether it moved midway."""

    pool: str
    replica: str
    model: str
    # A stream continued on another replica (mid-stream migration) leaves no faithful stored copy: the first
    # replica died with its state, and the second stored only the continuation, under an id of its own.
    migrated: bool = False
    tenant: str = ""  # who made it ("" in mappings written before tenants were kept: nobody's, so not served)


def response_not_found(response_id: str) -> GatewayError:
    """404 in the shape vLLM answers for an unknown response id."""
    return GatewayError(404, f"Response with id '{response_id}' not found.", param="response_id",
                        code="response_not_found")


def response_migrated(response_id: str) -> GatewayError:
    """404: the response was finished on another replica after its own failed, so no replica stores it whole."""
    return GatewayError(
        404, f"Response '{response_id}' was completed on another replica after its replica failed mid-stream; "
        "no replica stores it whole, so it cannot be retrieved or continued with previous_response_id. "
        "Send the conversation as input instead.",
        param="response_id", code="response_not_stored",
    )


def holder_gone(response_id: str, replica: str) -> GatewayError:
    """503: the replica that holds the response is not in rotation (restarted, removed or failing)."""
    return GatewayError(
        503, f"Response '{response_id}' is held by replica {replica}, which is not available; "
        "its state cannot be moved to another replica.",
        type="service_unavailable", code="response_replica_unavailable",
    )


class ResponseRoutes:
    """Reads and writes the response id → replica map; a store outage loses affinity, never the request."""

    def __init__(self, store: Store, ttl_s: float) -> None:
        self._store = store
        self._ttl_s = ttl_s

    async def remember(self, response_id: str, holder: Holder) -> None:
        """Record where a finished response lives."""
        try:
            value = "\t".join(
                (holder.pool, holder.replica, holder.model, "migrated" if holder.migrated else "", holder.tenant)
            )
            await self._store.remember(_PREFIX + response_id, value, self._ttl_s)
        except StoreUnavailable:
            log.warning("store unavailable: response %s will not be routable by id", response_id)

    async def recall(self, response_id: str) -> Holder | None:
        """Where a response lives, if it is remembered."""
        try:
            value = await self._store.recall(_PREFIX + response_id)
        except StoreUnavailable:
            return None
        if value is None:
            return None
        parts = value.split("\t")
        if len(parts) == 3:  # written before the migrated flag existed
            return Holder(parts[0], parts[1], parts[2])
        if len(parts) == 4:
            return Holder(parts[0], parts[1], parts[2], parts[3] == "migrated")
        return Holder(parts[0], parts[1], parts[2], parts[3] == "migrated", parts[4]) if len(parts) == 5 else None

    @staticmethod
    def usable(response_id: str, holder: Holder | None, tenant_id: str) -> Holder:
        """The holder of a response `tenant_id` names, or the 404 that says why there is none (another tenant's
        response is not found, as an unknown id is: its existence is not told)."""
        if holder is None or not hmac.compare_digest(holder.tenant.encode(), tenant_id.encode()):
            raise response_not_found(response_id)
        if holder.migrated:
            raise response_migrated(response_id)
        return holder
