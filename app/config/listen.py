"""The `listen` section: the address, slow-client deadlines, per-client caps, header bounds, the drain."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import AfterValidator, Field

from app.config.types import StrictModel


def _check_cidr(cidr: str) -> str:
    ipaddress.ip_network(cidr, strict=False)  # ValueError names the entry
    return cidr


Cidr = Annotated[str, AfterValidator(_check_cidr)]


class Listen(StrictModel):
    """Where the gateway listens, and how it treats slow, idle and draining connections."""

    host: str = Field("127.0.0.1", description="Address to bind; `0.0.0.0` for all interfaces.")
    port: int = Field(8080, ge=0, le=65535, description="Port to bind (0: any free port).")
    header_timeout_s: float = Field(10.0, gt=0, description=(
        "A request's headers must arrive within this of its first byte (or of the connection); a stalled "
        "socket is closed and counted (slow clients)."))
    body_timeout_s: float = Field(30.0, gt=0, description="A request's body must arrive within this of its headers.")
    max_connections_per_client: int = Field(256, ge=1, description=(
        "Open connections one client address may hold at once; one more is answered 503 and closed."))
    trusted_proxies: list[Cidr] = Field(default_factory=list, description=(
        "CIDRs of proxies in front of the gateway: their connections count against max_connections_per_client "
        "as the client `forwarded_for_header` names (its rightmost hop that is not a trusted proxy); empty: each "
        "peer address is its own client."))
    forwarded_for_header: str = Field("x-forwarded-for", description=(
        "Where trusted proxies name the client (comma-separated hops); read only on their connections."))
    max_header_bytes: int = Field(64 * 1024, ge=1024, description=(
        "Most bytes a request's URL and headers may take; more is answered 431 and the connection closed."))
    max_header_count: int = Field(128, ge=8, description=(
        "Most headers one request may send; more is answered 431 and the connection closed."))
    keepalive_timeout_s: float = Field(5.0, gt=0, description="An idle keep-alive connection is closed after this.")
    drain_s: float = Field(30.0, ge=0, description=(
        "On SIGTERM, open requests get up to this long (from the signal) to finish."))
    drain_notice_s: float = Field(1.0, ge=0, description=(
        "On SIGTERM, /ready turns 503 and the listener stays open this much longer (load balancers see the "
        "readiness change), then stops accepting."))
    write_timeout_s: float = Field(30.0, gt=0, description=(
        "A response the client stops reading this long (send buffer full) is cut: the connection closed, the "
        "upstream request aborted, its limit slot freed."))
    workers: int = Field(1, ge=1, le=64, description=(
        "Processes serving this port (SO_REUSEPORT); more than one needs a shared store (`store.url`)."))
