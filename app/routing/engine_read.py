"""Keep each replica's EngineInfo current and apply it where the config is silent.

The scraper hands every /metrics body here (`on_metrics`, each probe: the spec_decode series and
cache_config_info are two C-level finds and one label line) and, once per healthy spell, /v1/models and
/version (`read_once`: a restarted engine may have new flags). Applied: a replica's capacity (vLLM's
max_num_seqs, when the pool's config does not give it) and its pool's refused request fields (when the config
names neither `unsupported_params` nor `speculative`). A configured value that disagrees with what a replica
publishes stays in force, and is logged once per (pool, replica, key) and counted (`Disagreements`).
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson

from app.routing.engine_info import EngineInfo, from_metrics, from_models, from_version
from app.routing.state import ClusterState, PoolState, ReplicaState

log = logging.getLogger(__name__)


class Disagreements:
    """Config values that disagree with what a replica publishes: each (pool, replica, key) logged once, counted."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, str], tuple[str, str]] = {}

    def note(self, pool: str, replica: str, key: str, configured: object, published: object) -> bool:
        """Record one disagreement; logs (and returns True) the first time this (pool, replica, key) shows it."""
        where = (pool, replica, key)
        value = (str(configured), str(published))
        if self._seen.get(where) == value:
            return False
        self._seen[where] = value
        log.warning(
            "pool %s replica %s: config %s=%s but the engine publishes %s; the config's value stays in force",
            pool, replica, key, configured, published,
        )  # fmt: skip
        return True

    def counts(self) -> dict[tuple[str, str], int]:
        """Replicas disagreeing with the config, by (pool, key)."""
        out: dict[tuple[str, str], int] = {}
        for pool, _, key in self._seen:
            out[(pool, key)] = out.get((pool, key), 0) + 1
        return out

    def entries(self) -> list[tuple[str, str, str, str, str]]:
        """(pool, replica, key, configured, published) of every disagreement seen."""
        return [(*where, *value) for where, value in self._seen.items()]


class EngineReader:
    """Folds what the replicas publish into their EngineInfo, capacity and pool capabilities."""

    def __init__(self, cluster: ClusterState, disagreements: Disagreements | None = None) -> None:
        self.cluster = cluster
        self.disagreements = disagreements if disagreements is not None else Disagreements()

    def on_metrics(self, replica: ReplicaState, text: str) -> None:
        """One /metrics body of `replica` was read."""
        self._update(replica, from_metrics(text))

    def on_unhealthy(self, replica: ReplicaState) -> None:
        """The replica failed its probe: what /v1/models said is read again once it is back (maybe restarted)."""
        replica.engine_read = False

    async def read_once(
        self, session: aiohttp.ClientSession, replica: ReplicaState, limit: aiohttp.ClientTimeout
    ) -> None:
        """/v1/models and /version, once per healthy spell (a failed read is retried at the next probe)."""
        if replica.engine_read:
            return
        pool = self.cluster.pools.get(replica.pool)
        models = await _get_json(session, replica.url + "/v1/models", limit)
        version = await _get_json(session, replica.url + "/version", limit)
        if models is None:
            return
        info = from_models(models, pool.cfg.served_model if pool is not None else "")
        replica.engine_read = True
        self._update(replica, info.merged(from_version(version)))

    def _update(self, replica: ReplicaState, info: EngineInfo) -> None:
        new = replica.engine.merged(info)
        if new == replica.engine:
            return
        replica.engine = new
        pool = self.cluster.pools.get(replica.pool)
        if pool is not None:
            self.apply(pool, replica)

    def apply(self, pool: PoolState, replica: ReplicaState) -> None:
        """Capacity and the pool's refused fields from the replica's engine facts; note where the config differs."""
        info, cfg = replica.engine, pool.cfg
        if cfg.max_num_seqs is not None:
            if info.max_num_seqs is not None and info.max_num_seqs != cfg.max_num_seqs:
                self.disagreements.note(pool.name, replica.url, "max_num_seqs", cfg.max_num_seqs, info.max_num_seqs)
        else:
            replica.capacity = info.max_num_seqs or 0
        said = "speculative" in cfg.model_fields_set
        if said and info.speculative is not None and cfg.speculative != info.speculative:
            self.disagreements.note(pool.name, replica.url, "speculative", cfg.speculative, info.speculative)
        pool.refresh_capabilities()


async def _get_json(session: aiohttp.ClientSession, url: str, limit: aiohttp.ClientTimeout) -> Any | None:
    try:
        async with session.get(url, timeout=limit) as resp:
            if resp.status != 200:
                return None
            return orjson.loads(await resp.read())
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return None
