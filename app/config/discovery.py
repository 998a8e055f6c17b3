"""A pool's `discovery:` settings: where its replicas come from (DNS records or EndpointSlices) and, optionally,
where each discovered replica publishes its KV-cache events.

Part of the schema (PoolConfig mounts it at `pools.<p>.discovery`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from app.config.types import StrictModel

HOST = "{host}"


class KubernetesSelector(StrictModel):
    """EndpointSlices that hold a pool's pods: `kubernetes.io/service-name=vllm-fast-pods`, or the pods' labels."""

    namespace: str | None = Field(None, description=(
        "Namespace of the EndpointSlices; null: the one the gateway's own pod runs in (its service-account mount)."))
    label_selector: str = Field(min_length=1, description=(
        "Label selector of the EndpointSlices, e.g. `kubernetes.io/service-name=vllm-fast-pods`."))
    port: int | Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")] = Field(description=(
        "The engine's port: a number, or the name of the EndpointSlice port (`http`)."))

    @field_validator("port", mode="before")
    @classmethod
    def _digits_are_a_number(cls, v: object) -> object:
        # A port from an environment variable arrives as text; "8000" is the number, not a port named "8000".
        return int(v) if isinstance(v, str) and v.isdigit() else v


class DiscoveredEvents(StrictModel):
    """Where every discovered replica publishes vLLM's KV events: endpoints with `{host}` for its address."""

    endpoint: str = Field(pattern=r"^tcp://\{host\}:\d{1,5}$", description=(
        "`tcp://{host}:<port>`: vLLM binds tcp://*:<port> on its side; the gateway connects to each replica's "
        "address."))
    replay: str | None = Field(None, pattern=r"^tcp://\{host\}:\d{1,5}$", description=(
        "`tcp://{host}:<port>` of vLLM's replay socket."))
    topic: str = Field("kv", description="ZMQ topic of the events.")

    def for_address(self, address: str) -> tuple[str, str | None]:
        """The (endpoint, replay) of the replica at `address` (an IPv6 address in brackets)."""
        host = f"[{address}]" if ":" in address and not address.startswith("[") else address
        return self.endpoint.replace(HOST, host), self.replay.replace(HOST, host) if self.replay else None


class DiscoveryConfig(StrictModel):
    """Where a pool's replicas come from instead of a static list: DNS A/AAAA records, or EndpointSlices."""

    dns: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+:\d{1,5}$")] | None = Field(None, description=(
        "host:port, e.g. a headless Service `vllm-fast-pods.kvgate.svc:8000`; every address is one replica."))
    kubernetes: KubernetesSelector | None = Field(None, description="EndpointSlices instead of DNS.")
    scheme: Literal["http", "https"] = Field("http", description="Scheme of the discovered replicas' URLs.")
    interval_s: float | None = Field(None, gt=0, description=(
        "How often the source is read again; null: `routing.probe_interval_s`."))
    kv_events: DiscoveredEvents | None = Field(None, description=(
        "Each discovered replica's KV-event endpoints: it gets a subscription when it appears, loses it when it "
        "goes."))

    @model_validator(mode="after")
    def _one_source(self) -> DiscoveryConfig:
        if (self.dns is None) == (self.kubernetes is None):
            raise ValueError("give exactly one of dns or kubernetes")
        return self
