"""Say what the gateway read from each replica, what the config overrides, and what disagrees with the config.

Printed by `kvgate check-config --probe` (one probe of every replica, then exit) and by `kvgate serve` after its
ready line (what the first probes read). One line per replica, one per model hashed for kv_events, one per
disagreement.
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

from app.config import GatewayConfig
from app.config.policies import KvEventsParams
from app.kvcache.hashers import BlockHashers
from app.routing.engine_read import Disagreements, EngineReader
from app.routing.state import ClusterState, PoolState, ReplicaState

PROBE_TIMEOUT_S = 5.0


def replica_line(pool: PoolState, r: ReplicaState) -> str:
    """`engine fast http://…: read …; config overrides …; in force: …`."""
    facts = ", ".join(f"{k}={v}" for k, v in r.engine.facts().items()) or "nothing (not reachable yet)"
    cfg = pool.cfg
    overrides = []
    if cfg.max_num_seqs is not None:
        overrides.append(f"max_num_seqs={cfg.max_num_seqs}")
    if pool.declares_capabilities():
        overrides.append(f"speculative={cfg.speculative}")
    if cfg.unsupported_params:
        overrides.append(f"unsupported_params=[{', '.join(cfg.unsupported_params)}]")
    policy = cfg.effective_policy()
    if isinstance(policy, KvEventsParams):
        overrides += [f"{k}={v}" for k in ("block_size", "hash_algo") if (v := getattr(policy, k)) is not None]
    refuses = ", ".join(pool.unsupported_params) or "nothing"
    slots = r.capacity or "unknown"
    return (
        f"engine {pool.name} {r.url}: read {facts}; config overrides {', '.join(overrides) or 'nothing'}; "
        f"in force: {slots} slots, refuses {refuses}"
    )


def hashing_lines(hashers: BlockHashers) -> list[str]:
    """How each kv_events model's requests are hashed now."""
    out = []
    for model in hashers.models():
        got = hashers.resolved(model)
        how = f"block_size={got[0]}, hash_algo={got[1]}" if got else "not hashed (nothing published, or disagreeing)"
        out.append(f"kv_events {model}: {how}")
    return out


def disagreement_lines(d: Disagreements) -> list[str]:
    """One line per replica whose published value differs from the config's."""
    return [
        f"disagrees: pool {pool} replica {url}: config {key}={conf}, engine publishes {pub} (config in force)"
        for pool, url, key, conf, pub in d.entries()
    ]


def report(cfg: GatewayConfig, cluster: ClusterState, hashers: BlockHashers) -> list[str]:
    """Every line: replicas, hashing, disagreements."""
    lines = [replica_line(p, r) for p in cluster.pools.values() for r in p.replicas]
    return lines + hashing_lines(hashers) + disagreement_lines(hashers.disagreements)


async def probe(cfg: GatewayConfig) -> list[str]:
    """Probe every configured replica once (/metrics, /v1/models, /version) and report what was read."""
    cluster = ClusterState.from_config(cfg)
    disagreements = Disagreements()
    reader = EngineReader(cluster, disagreements)
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    async with aiohttp.ClientSession() as session:
        for r in cluster.replicas():
            await _probe_one(session, reader, r, timeout)
    return report(cfg, cluster, BlockHashers(cfg, None, lambda: cluster, disagreements))


async def _probe_one(
    session: aiohttp.ClientSession, reader: EngineReader, r: ReplicaState, limit: aiohttp.ClientTimeout
) -> None:
    try:
        async with session.get(r.url + "/metrics", timeout=limit) as resp:
            if resp.status == 200:
                reader.on_metrics(r, await resp.text())
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return
    await reader.read_once(session, r, limit)


def startup_lines(gateway: object) -> Sequence[str]:
    """The report of a running gateway (empty when it is not one): its BlockHashing hook's hashers (app.gateway
    builds them only with a KV-event hub), else hashers over the same cluster and disagreements (none hash)."""
    cluster = getattr(gateway, "cluster", None)
    cfg = getattr(gateway, "cfg", None)
    if not isinstance(cluster, ClusterState) or not isinstance(cfg, GatewayConfig):
        return []
    hashers = getattr(getattr(gateway, "blocks", None), "hashers", None)
    if not isinstance(hashers, BlockHashers):
        disagreements = getattr(gateway, "disagreements", None)
        hashers = BlockHashers(cfg, None, lambda: cluster,
                               disagreements if isinstance(disagreements, Disagreements) else None)
    return report(cfg, cluster, hashers)
