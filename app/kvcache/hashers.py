"""The request hasher of each model, at the KV block size and hash algorithm its replicas publish.

Both decide every block hash, and both differ between deployments (vLLM's block size is 16 on GPUs and 128 on
vLLM-CPU; `--prefix-caching-hash-algo` is a flag), so a value guessed in config turns every prediction cold.
The replicas say: each `BlockStored` event carries its `block_size`, and `/metrics` `vllm:cache_config_info`
has `block_size` and `prefix_caching_hash_algo` (app/routing/engine_info.py). Resolved per request over every
replica of the model's kv_events pools (a body is hashed once, before pick chooses among them):

- the policy's `block_size` / `hash_algo`, when set, is an override: it stays in force, and a replica that
  publishes otherwise is logged once and counted (app/routing/engine_read.Disagreements);
- else what the replicas publish, events first (they are the hashes themselves);
- replicas that publish different values: no hashes (pick falls back to prefix affinity for the model), and
  one error log naming them — one block size per model, or an override;
- nothing published yet (no scrape, no event): no hashes either; the index is empty then as well.

The tokenizer is loaded once per folder, at start-up; a block size or algorithm is a variant of it that
shares the tokenizer and its piece cache (RequestBlocks.variant: no file read on the request path).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast, get_args

from app.config.policies import KvEventsParams
from app.kvcache.hashing import HashAlgo
from app.routing.engine_read import Disagreements

if TYPE_CHECKING:
    from app.config import GatewayConfig
    from app.kvcache.subscriber import KvEventsHub
    from app.kvcache.tokens import RequestBlocks
    from app.routing.state import ClusterState

log = logging.getLogger(__name__)

DEFAULT_ALGO: HashAlgo = "sha256_cbor"  # kvgate's recommendation while no replica has said
_ALGOS: frozenset[str] = frozenset(get_args(HashAlgo))


@dataclass(frozen=True, slots=True)
class _Plan:
    """One model's kv_events pools, the tokenizer folder of the first, and its policy's overrides."""

    pools: tuple[str, ...]
    folder: str
    block_size: int | None
    algo: HashAlgo | None


class BlockHashers:
    """`get(model)`: the RequestBlocks to hash that model's chat bodies with now, or None (pick falls back)."""

    def __init__(
        self,
        cfg: GatewayConfig,
        hub: KvEventsHub | None,
        cluster: Callable[[], ClusterState],
        disagreements: Disagreements | None = None,
    ) -> None:
        self._hub = hub
        self._cluster = cluster
        self.disagreements = disagreements if disagreements is not None else Disagreements()
        self._plans: dict[str, _Plan] = {}
        self._bases: dict[str, RequestBlocks] = {}
        self._variants: dict[tuple[str, int, str], RequestBlocks] = {}
        self._refusals: dict[str, str] = {}
        for model in cfg.models:
            kv = [n for n in model.pools if isinstance(cfg.pools[n].effective_policy(), KvEventsParams)]
            first = next((n for n in kv if cfg.pools[n].tokenizer is not None), None)
            if first is None:
                continue
            pool = cfg.pools[first]
            policy = pool.effective_policy()
            assert isinstance(policy, KvEventsParams) and pool.tokenizer is not None
            self._plans[model.name] = _Plan(tuple(kv), pool.tokenizer, policy.block_size, policy.hash_algo)
            if hub is not None and pool.tokenizer not in self._bases:  # no events, no hashing (check-config)
                from app.kvcache.tokens import RequestBlocks  # needs the `kv` extra (tokenizers, jinja2)

                self._bases[pool.tokenizer] = RequestBlocks(pool.tokenizer, policy.block_size or 16)

    def get(self, model: str) -> RequestBlocks | None:
        """The hasher for `model` at its replicas' block size and algorithm (None: not known, or they disagree)."""
        plan = self._plans.get(model)
        if plan is None or plan.folder not in self._bases:
            return None
        resolved = self._resolve(model, plan)
        if resolved is None:
            return None
        key = (plan.folder, *resolved)
        hasher = self._variants.get(key)
        if hasher is None:
            base = self._bases[plan.folder]
            hasher = self._variants[key] = base.variant(resolved[0], resolved[1])
        return hasher

    def resolved(self, model: str) -> tuple[int, HashAlgo] | None:
        """The block size and algorithm `model` is hashed with now (None: not hashed)."""
        plan = self._plans.get(model)
        return self._resolve(model, plan) if plan is not None else None

    def models(self) -> list[str]:
        """Models with a kv_events pool that names a tokenizer."""
        return list(self._plans)

    def _resolve(self, model: str, plan: _Plan) -> tuple[int, HashAlgo] | None:
        sizes: dict[int, list[str]] = {}
        algos: dict[str, list[str]] = {}
        hub = self._hub
        pools = self._cluster().pools
        for name in plan.pools:
            pool = pools.get(name)
            for r in pool.replicas if pool is not None else ():
                bs = (hub.block_size(r.url) if hub is not None else None) or r.engine.block_size
                if bs is not None:
                    if plan.block_size is not None and bs != plan.block_size:
                        self.disagreements.note(name, r.url, "block_size", plan.block_size, bs)
                    sizes.setdefault(bs, []).append(r.url)
                algo = r.engine.hash_algo
                if algo is not None:
                    if plan.algo is not None and algo != plan.algo:
                        self.disagreements.note(name, r.url, "hash_algo", plan.algo, algo)
                    algos.setdefault(algo, []).append(r.url)
        block_size = plan.block_size
        if block_size is None:
            if len(sizes) != 1:
                if sizes:
                    self._refuse(model, "block sizes", sizes)
                return None
            block_size = next(iter(sizes))
        algo_name: str | None = plan.algo
        if algo_name is None:
            if len(algos) > 1:
                self._refuse(model, "hash algorithms", algos)
                return None
            algo_name = next(iter(algos), DEFAULT_ALGO)
        if algo_name not in _ALGOS:
            self._refuse(model, "hash algorithms", {algo_name: [u for us in algos.values() for u in us]})
            return None
        if model in self._refusals:
            del self._refusals[model]
            log.info("model %s: kv_events hashing resumes (block size %d, %s)", model, block_size, algo_name)
        return block_size, cast(HashAlgo, algo_name)

    def _refuse(self, model: str, what: str, by_value: dict[int, list[str]] | dict[str, list[str]]) -> None:
        detail = "; ".join(f"{v}: {', '.join(urls)}" for v, urls in by_value.items())
        if self._refusals.get(model) != detail:
            self._refusals[model] = detail
            log.error(
                "model %s: its kv_events replicas publish different KV %s (%s), or one kvgate cannot reproduce "
                "(xxhash is seeded per process): its requests are routed by prefix affinity until they agree. "
                "Run them with one --block-size and --prefix-caching-hash-algo sha256_cbor (or sha256), or give "
                "the pool's policy block_size / hash_algo.",
                model, what, detail,
            )  # fmt: skip
