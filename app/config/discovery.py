"""A pool's `discovery:` settings: where its replicas come from (DNS records or EndpointSlices) and, optionally,
where each discovered replica publishes its KV-cache events.

Self-contained (no import of app.config) so PoolConfig can mount it at `pools.<p>.discovery`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

HOST = "{host}"


class KubernetesSelector(BaseModel):
    """EndpointSlices that hold a pool's pods: `kubernetes.io/service-name=vllm-fast-pods`, or the pods' labels."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # None: the namespace the gateway's own pod runs in (its service-account mount says which).
    namespace: str | None = None
    label_selector: str = Field(min_length=1)
    # The engine's port: a number, or the name of the EndpointSlice port (`http`).
    port: int | Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]


class DiscoveredEvents(BaseModel):
    """Where every discovered replica publishes vLLM's KV events: endpoints with `{host}` for its address."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # vLLM binds tcp://*:5557 on its side; the gateway connects to each replica's address.
    endpoint: str = Field(pattern=r"^tcp://\{host\}:\d{1,5}$")
    replay: str | None = Field(None, pattern=r"^tcp://\{host\}:\d{1,5}$")
    topic: str = "kv"

    def for_address(self, address: str) -> tuple[str, str | None]:
        """The (endpoint, replay) of the replica at `address` (an IPv6 address in brackets)."""
        host = f"[{address}]" if ":" in address and not address.startswith("[") else address
        return self.endpoint.replace(HOST, host), self.replay.replace(HOST, host) if self.replay else None


class DiscoveryConfig(BaseModel):
    """Where a pool's replicas come from instead of a static list: DNS A/AAAA records, or EndpointSlices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # host:port, e.g. a headless Service `vllm-fast-pods.kvgate.svc:8000`; every address is one replica.
    dns: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+:\d{1,5}$")] | None = None
    kubernetes: KubernetesSelector | None = None
    scheme: Literal["http", "https"] = "http"
    # How often the source is read again; None: routing.probe_interval_s.
    interval_s: float | None = Field(None, gt=0)
    # Each discovered replica's KV-event endpoints: it gets a subscription when it appears, loses it when it goes.
    kv_events: DiscoveredEvents | None = None

    @model_validator(mode="after")
    def _one_source(self) -> DiscoveryConfig:
        if (self.dns is None) == (self.kubernetes is None):
            raise ValueError("give exactly one of dns or kubernetes")
        return self
