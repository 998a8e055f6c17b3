"""Replica discovery: pools whose replicas are DNS A/AAAA records or Kubernetes EndpointSlices, re-read every
interval; a change hands the gateway a config with the new replica lists (it rebuilds its ClusterState).

What a change means for routing: a replica that appears joins out of rotation and enters after its first good
probe (`ClusterState.from_config(probe_before_joining=True)`); a replica that vanishes leaves the cluster, so it takes
no new request, while requests already on it finish (they hold its ReplicaState). A source that fails (resolver
timeout, API error) keeps the pool's last known replicas: the probes, not the resolver, decide that a replica is
dead, so a DNS hiccup never empties a pool.

Rendezvous hashing needs nothing else to stay consistent across gateway processes: every process that sees
the same addresses builds the same replica URLs, hence the same scores for a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from app.config.discovery import DiscoveryConfig, KubernetesSelector
from app.config.models import GatewayConfig, ReplicaEvents
from app.telemetry import instruments as ins

log = logging.getLogger(__name__)

# getaddrinfo runs in the loop's executor and has no timeout of its own (the system resolver's can be 5 s per try).
RESOLVE_TIMEOUT_S = 3.0
# In a pod the service account says which namespace the gateway runs in.
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


class DiscoveryError(Exception):
    """A source could not be read this round (the pool keeps its last known replicas)."""


class Source(Protocol):
    """Where one pool's replica URLs come from."""

    description: str

    async def urls(self) -> list[str]:
        """The replica URLs now, sorted; raises DiscoveryError when the source cannot say."""
        ...

    async def aclose(self) -> None:
        """Release what the source holds (an API client)."""
        ...


def replica_url(scheme: str, address: str, port: int) -> str:
    """`scheme://address:port`, the address of an IPv6 record in brackets."""
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the machine's resolver gives `host` (A and AAAA), without blocking the loop."""
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP), RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError) as err:  # socket.gaierror is an OSError
        raise DiscoveryError(f"resolving {host}: {err}") from err
    return [str(info[4][0]) for info in infos]


@dataclass(slots=True)
class DnsSource:
    """Every A/AAAA record of `host` is one replica on `port` (a headless Service, scaled compose, Consul)."""

    host: str
    port: int
    scheme: str = "http"
    resolver: Resolver = system_resolver
    description: str = ""

    def __post_init__(self) -> None:
        self.description = self.description or f"dns {self.host}:{self.port}"

    async def urls(self) -> list[str]:
        """One URL per distinct address, sorted (a resolver's order rotates between answers)."""
        addresses = await self.resolver(self.host, self.port)
        unique = {_canonical_ip(a) for a in addresses}
        return sorted(replica_url(self.scheme, a, self.port) for a in unique)

    async def aclose(self) -> None:
        """Nothing to release."""


def _canonical_ip(address: str) -> str:
    # getaddrinfo may give "fe80::1%eth0" or a long form; one spelling per address keeps one ReplicaState.
    base, _, zone = address.partition("%")
    try:
        text = str(ipaddress.ip_address(base))
    except ValueError:
        return address
    return f"{text}%{zone}" if zone else text


@dataclass(slots=True)
class KubernetesSource:
    """The ready endpoints of the EndpointSlices a label selector picks, read through the `kubernetes_asyncio`
    client (the `k8s` extra): in a pod with its service account, else with the local kubeconfig."""

    selector: KubernetesSelector
    scheme: str = "http"
    # Tests pass an ApiClient pointed at their own API server; by default one is made on first use.
    api_client: Any = None
    description: str = ""
    _api: Any = field(default=None, repr=False)
    _namespace: str | None = None

    def __post_init__(self) -> None:
        self.description = self.description or f"kubernetes endpointslices {self.selector.label_selector}"

    async def urls(self) -> list[str]:
        """Addresses of endpoints that are ready and not terminating, on the selected port."""
        api, namespace = await self._client()
        try:
            slices = await api.list_namespaced_endpoint_slice(namespace, label_selector=self.selector.label_selector)
        except Exception as err:  # ApiException, aiohttp errors, timeouts: this round is unknown
            raise DiscoveryError(f"listing endpointslices in {namespace}: {type(err).__name__}: {err}") from err
        return endpoint_urls(_as_dicts(api, slices.items), self.selector.port, self.scheme)

    async def aclose(self) -> None:
        """Close the API client's HTTP session."""
        if self._api is not None:
            await self._api.api_client.close()
            self._api = None

    async def _client(self) -> tuple[Any, str]:
        if self._api is None:
            try:
                from kubernetes_asyncio import client, config
            except ModuleNotFoundError as err:
                raise DiscoveryError("kubernetes discovery needs the k8s extra: pip install 'kvgate[k8s]'") from err
            api_client = self.api_client
            if api_client is None:
                try:
                    await asyncio.to_thread(config.load_incluster_config)  # reads the token and CA files
                except config.ConfigException:
                    await config.load_kube_config()
                api_client = client.ApiClient()
            self._api = client.DiscoveryV1Api(api_client)
        namespace = self._namespace
        if namespace is None:
            namespace = self.selector.namespace
            if namespace is None:
                namespace = await asyncio.to_thread(_own_namespace)
            self._namespace = namespace
        return self._api, namespace


def _own_namespace() -> str:
    try:
        return NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def _as_dicts(api: Any, items: Iterable[Any]) -> list[Mapping[str, Any]]:
    # The client's models use snake_case attributes; its sanitizer gives the API's own camelCase JSON.
    return [api.api_client.sanitize_for_serialization(item) for item in items]


def endpoint_urls(slices: Iterable[Mapping[str, Any]], port: int | str, scheme: str = "http") -> list[str]:
    """Replica URLs from EndpointSlices (API JSON): ready, non-terminating endpoints, on `port` (a number, or
    the name of the slice's port, whose number may differ per slice)."""
    out: set[str] = set()
    for s in slices:
        if isinstance(port, int):
            number: int | None = port
        else:
            number = next((p.get("port") for p in s.get("ports") or () if p.get("name") == port), None)
        if number is None:
            continue
        for ep in s.get("endpoints") or ():
            cond = ep.get("conditions") or {}
            # The API's rule: a missing `ready` means ready; a terminating endpoint drains, it takes nothing new.
            if cond.get("ready") is False or cond.get("terminating") is True:
                continue
            for address in ep.get("addresses") or ():
                out.add(replica_url(scheme, _canonical_ip(address), number))
    return sorted(out)


def source_for(cfg: DiscoveryConfig, resolver: Resolver = system_resolver) -> Source:
    """The source a pool's `discovery:` names."""
    if cfg.dns is not None:
        host, _, port = cfg.dns.rpartition(":")
        return DnsSource(host, int(port), cfg.scheme, resolver)
    assert cfg.kubernetes is not None  # DiscoveryConfig holds exactly one source
    return KubernetesSource(cfg.kubernetes, cfg.scheme)


def with_replicas(cfg: GatewayConfig, found: Mapping[str, Sequence[str]]) -> GatewayConfig:
    """`cfg` with the discovered pools' replica lists filled in (the static pools as they are), and each
    replica's KV-event endpoints where the pool's discovery names them."""
    pools = dict(cfg.pools)
    for name, urls in found.items():
        update: dict[str, Any] = {"replicas": list(urls)}
        discovery = pools[name].discovery
        events = discovery.kv_events if discovery is not None else None
        if events is not None:
            update["replica_events"] = {
                u: ReplicaEvents(endpoint=ep, replay=replay, topic=events.topic)
                for u in urls
                for ep, replay in [events.for_address(urlsplit(u).hostname or "")]
            }
        pools[name] = pools[name].model_copy(update=update)
    return cfg.model_copy(update={"pools": pools})


@dataclass(slots=True)
class PoolDiscovery:
    """One pool's source and what it last said."""

    source: Source
    urls: list[str] = field(default_factory=list)
    # Rounds whose read failed since the last good one, and in total (for /metrics).
    failing: int = 0
    errors: int = 0
    changes: int = 0
    read: bool = False


class Discoverer:
    """Re-reads every discovering pool's source each interval; on any change calls `on_change(config)` with
    the config whose pools list the replicas found (the caller rebuilds its ClusterState from it)."""

    def __init__(
        self,
        cfg: GatewayConfig,
        sources: Mapping[str, Source],
        on_change: Callable[[GatewayConfig], None],
        *,
        interval_s: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.pools = {name: PoolDiscovery(src) for name, src in sources.items()}
        self._on_change = on_change
        given = [p.discovery.interval_s for p in cfg.pools.values() if p.discovery and p.discovery.interval_s]
        self.interval_s = interval_s or (min(given) if given else cfg.routing.probe_interval_s)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def for_config(
        cls, cfg: GatewayConfig, on_change: Callable[[GatewayConfig], None], resolver: Resolver = system_resolver
    ) -> Discoverer | None:
        """A discoverer for the pools that name `discovery:`; None when every pool lists static replicas."""
        sources = {n: source_for(p.discovery, resolver) for n, p in cfg.pools.items() if p.discovery is not None}
        return cls(cfg, sources, on_change) if sources else None

    async def start(self) -> None:
        """Read every source once (so the first requests have replicas), then keep reading in the background."""
        if self._task is not None:
            return
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="kvgate-discovery")

    async def stop(self) -> None:
        """Stop reading; close the sources."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for pool in self.pools.values():
            with contextlib.suppress(Exception):
                await pool.source.aclose()

    async def refresh(self) -> bool:
        """One round over every source (concurrently); True when some pool's replicas changed."""
        names = list(self.pools)
        results = await asyncio.gather(*(self.pools[n].source.urls() for n in names), return_exceptions=True)
        changed = False
        for name, result in zip(names, results, strict=True):
            pool = self.pools[name]
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                pool.errors += 1
                pool.failing += 1
                if pool.failing == 1 or pool.failing % 100 == 0:  # once per outage, then a reminder
                    log.warning("discovery for pool %s (%s) failed, keeping %d replica(s): %s",
                                name, pool.source.description, len(pool.urls), result)  # fmt: skip
                continue
            if pool.failing:
                log.warning("discovery for pool %s works again", name)
            pool.failing = 0
            pool.read = True
            if result != pool.urls:
                log.info("pool %s: replicas %s -> %s", name, pool.urls, result)
                pool.urls = result
                pool.changes += 1
                changed = True
        if changed:
            self._on_change(with_replicas(self.cfg, {n: p.urls for n, p in self.pools.items() if p.read}))
        return changed

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in a rebuild must not stop discovery for good
                log.exception("discovery round failed")

    def register_metrics(self, meter: Meter) -> None:
        """Replicas found and failed reads per discovering pool, observed at each collection."""

        def replicas(options: CallbackOptions) -> Iterable[Observation]:
            for name, pool in self.pools.items():
                yield Observation(len(pool.urls), {"pool": name})

        def errors(options: CallbackOptions) -> Iterable[Observation]:
            for name, pool in self.pools.items():
                yield Observation(pool.errors, {"pool": name})

        def changes(options: CallbackOptions) -> Iterable[Observation]:
            for name, pool in self.pools.items():
                yield Observation(pool.changes, {"pool": name})

        for spec, callback in ((ins.DISCOVERY_REPLICAS, replicas), (ins.DISCOVERY_ERRORS, errors),
                               (ins.DISCOVERY_CHANGES, changes)):  # fmt: skip
            ins.observe(meter, spec, callback)
