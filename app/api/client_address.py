"""Which client a connection speaks for: its peer address, or, from a trusted proxy, the forwarded-for address.

Behind a load balancer every connection comes from the balancer's address, so a per-address cap
(`listen.max_connections_per_client`) would make all clients share one allowance. A connection from an address
in `listen.trusted_proxies` (CIDRs) is instead counted against the client its `listen.forwarded_for_header`
names: the rightmost address in that header that is not itself a trusted proxy (each proxy appends the address
it saw, so entries left of the last untrusted one may be the client's own invention). A peer that is not trusted
is its own client, whatever header it sends.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.config.listen import Listen

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ClientAddresses:
    """Trusted proxy networks and the header they name the client in."""

    trusted: tuple[Network, ...] = field(default_factory=tuple)
    header: bytes = b"x-forwarded-for"

    @classmethod
    def from_listen(cls, listen: Listen) -> ClientAddresses:
        """What `listen.trusted_proxies` and `listen.forwarded_for_header` configure."""
        nets = tuple(ipaddress.ip_network(c, strict=False) for c in listen.trusted_proxies)
        return cls(nets, listen.forwarded_for_header.lower().encode("latin-1"))

    def trusts(self, address: str) -> bool:
        """Whether `address` is a trusted proxy."""
        if not self.trusted or not address:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.trusted)

    def client_of(self, peer: str, headers: list[tuple[bytes, bytes]]) -> str:
        """The client a request from `peer` speaks for (`headers` lowercase, as the parser gives them)."""
        if not self.trusts(peer):
            return peer
        hops = [h.strip() for name, value in headers if name == self.header for h in value.decode("latin-1").split(",")]
        for hop in reversed(hops):
            if hop and not self.trusts(hop):
                return hop
        return hops[0] if hops and hops[0] else peer
