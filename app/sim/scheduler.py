"""vLLM V1's scheduling rules: continuous batching under a token budget, chunked prefill, preemption, priority."""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from app.sim.kv_cache import BlockPool, max_hit_blocks
from app.sim.profiles import StepCost
from app.sim.request import SimRequest, Status


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The engine knobs the scheduler obeys."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    num_spec_tokens: int = 0  # K draft tokens per decode step (0: no speculative decoding)
    spec_accept: float = 0.0  # probability that each draft token is accepted
    spec_draft_prob: float = 1.0  # probability that the proposer has a draft for a sequence at a step (ngram: a match)
    policy: str = "fcfs"  # fcfs | priority


@dataclass(slots=True)
class Scheduled:
    """One request's share of a step."""

    req: SimRequest
    num_new: int  # tokens computed this step, draft tokens included
    num_draft: int


@dataclass(slots=True)
class Counters:
    """Cumulative engine counters, read by /metrics (no per-step cost)."""

    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    steps: int = 0


def _ceil_blocks(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


class Scheduler:
    """Waiting and running queues over one BlockPool; `schedule` picks a step, `finish_step` applies its results."""

    def __init__(self, config: SchedulerConfig, pool: BlockPool, *, seed: int = 0) -> None:
        self.config = config
        self.pool = pool
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.counters = Counters(spec_accepted_per_pos=[0] * config.num_spec_tokens)
        self._rng = random.Random(seed)
        self._priority = config.policy == "priority"

    # ------------------------------------------------------------------ queues
    def _key(self, r: SimRequest) -> tuple[int, float, int]:
        return (r.priority, r.arrival, r.seq)

    def add(self, req: SimRequest) -> None:
        """Queue a new request."""
        req.status = Status.WAITING
        if self._priority:
            bisect.insort(self.waiting, req, key=self._key)
        else:
            self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        """Drop a request wherever it is and free its blocks."""
        if req.status is Status.FINISHED:
            return
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self._free(req)
        else:
            if req in self.waiting:  # not there yet while the API server still holds it
                self.waiting.remove(req)
            if req.blocks:
                self._free(req)
        req.status = Status.FINISHED
        req.finish_reason = "abort"

    def has_work(self) -> bool:
        """Anything waiting or running."""
        return bool(self.waiting or self.running)

    def _free(self, req: SimRequest) -> None:
        self.pool.free_blocks(req.blocks)
        req.blocks = []
        req.num_cached_blocks = 0

    def _preempt(self, victim: SimRequest) -> None:
        # Recompute-style preemption (vLLM V1): drop the KV, requeue at the front with all tokens as prompt.
        self.running.remove(victim)
        self._free(victim)
        victim.num_computed = 0
        victim.num_preemptions += 1
        victim.status = Status.WAITING
        self.counters.preemptions += 1
        if self._priority:
            bisect.insort(self.waiting, victim, key=self._key)
        else:
            self.waiting.insert(0, victim)

    def _pick_victim(self) -> SimRequest:
        if self._priority:
            return max(self.running, key=self._key)
        return self.running[-1]

    # ---------------------------------------------------------------- schedule
    def schedule(self, now: float) -> list[Scheduled]:
        """Choose this step's batch: running requests first, then admit waiting ones if nothing was preempted."""
        cfg, pool = self.config, self.pool
        bs, free, running = pool.block_size, pool.free, self.running
        k_spec, max_len = cfg.num_spec_tokens, cfg.max_model_len
        p_draft, rng = cfg.spec_draft_prob, self._rng
        budget = cfg.max_num_batched_tokens
        out: dict[int, Scheduled] = {}
        preempted = False
        i = 0
        # The hot loop (every running request, every step): plain locals, no property calls.
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed
            n_tokens = len(req.tokens)
            num_new = n_tokens - computed
            drafts = 0
            if num_new == 1 and k_spec and (p_draft >= 1.0 or rng.random() < p_draft):
                drafts = max(min(k_spec, req.max_tokens - req.num_output - 1, max_len - n_tokens), 0)
            total = num_new + drafts
            if total > budget:
                total = budget
                drafts = max(total - num_new, 0)
            need = (computed + total + bs - 1) // bs - len(req.blocks)
            if need > len(free):
                scheduled_self = True
                while need > len(free):
                    victim = self._pick_victim()
                    vi = running.index(victim)
                    gone = out.pop(id(victim), None)
                    if gone is not None:
                        budget += gone.num_new
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        scheduled_self = False
                        break
                    if vi < i:
                        i -= 1
                if not scheduled_self:
                    continue
            if need > 0:
                new = pool.allocate(need)
                assert new is not None
                req.blocks.extend(new)
            # Like vLLM's allocate_slots: blocks this step will fill are findable at once (drafts excluded).
            upto = computed + total if computed + total < n_tokens else n_tokens
            if upto // bs > req.num_cached_blocks:
                self._commit(req, upto)
            out[id(req)] = Scheduled(req, total, drafts)
            budget -= total
            i += 1

        if not preempted:
            self._admit(now, budget, out)
        return list(out.values())

    def _admit(self, now: float, budget: int, out: dict[int, Scheduled]) -> None:
        cfg, pool = self.config, self.pool
        bs = pool.block_size
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            req.extend_hashes()
            hit = pool.find_longest_hit(req.hashes, max_hit_blocks(req.num_tokens, bs))
            hit_tokens = len(hit) * bs
            num_new = min(req.num_tokens - hit_tokens, budget)
            need = _ceil_blocks(hit_tokens + num_new, bs) - len(hit)
            if need + pool.evictable_among(hit) > pool.num_free:
                break
            pool.touch(hit)
            new = pool.allocate(need)
            assert new is not None
            self.waiting.pop(0)
            req.blocks = hit + new
            req.num_cached_blocks = len(hit)
            req.num_computed = hit_tokens
            if req.num_preemptions == 0:
                # vLLM counts a request's lookup once, at its first admission; resumed ones go elsewhere.
                self.counters.prefix_queries += req.num_tokens
                self.counters.prefix_hits += hit_tokens
            if req.cached_tokens < 0:
                req.cached_tokens = hit_tokens
                req.scheduled_ts = now
            req.status = Status.RUNNING
            self._commit(req, hit_tokens + num_new)
            self.running.append(req)
            out[id(req)] = Scheduled(req, num_new, 0)
            budget -= num_new

    @staticmethod
    def step_cost(batch: list[Scheduled]) -> StepCost:
        """What the profile needs to price this step."""
        prefill = decode = kv = drafts = pairs = ctx = 0
        for s in batch:
            r = s.req
            if r.num_tokens - r.num_computed == 1:
                decode += 1
                drafts += s.num_draft
                kv += r.num_computed
            else:
                prefill += s.num_new
                pairs += s.num_new * (r.num_computed + s.num_new // 2)
                ctx += r.num_computed
        return StepCost(prefill_tokens=prefill, decode_seqs=decode, kv_tokens=kv, draft_tokens=drafts,
                        prefill_pairs=pairs, prefill_ctx_tokens=ctx)

    # ------------------------------------------------------------- apply step
    def finish_step(
        self, batch: list[Scheduled], token_at: Callable[[SimRequest, int], int], now: float
    ) -> tuple[list[tuple[SimRequest, int]], list[SimRequest]]:
        """Advance every scheduled request by its step; return (request, new tokens) pairs and the finished."""
        c = self.counters
        c.steps += 1
        produced: list[tuple[SimRequest, int]] = []
        finished: list[SimRequest] = []
        accept, rng = self.config.spec_accept, self._rng
        for s in batch:
            req = s.req
            if req.status is not Status.RUNNING:
                continue  # aborted while the step ran
            req.num_computed += s.num_new - s.num_draft
            if req.num_computed < req.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            accepted = 0
            if s.num_draft:
                p_accept = req.accept if req.accept >= 0 else accept
                while accepted < s.num_draft and rng.random() < p_accept:
                    accepted += 1
                c.spec_drafts += 1
                c.spec_draft_tokens += s.num_draft
                c.spec_accepted += accepted
                per_pos = c.spec_accepted_per_pos
                for p in range(accepted):
                    per_pos[p] += 1
            n_new = 1 + accepted
            reason: str | None = None
            base = req.num_output
            if req.eos_at is not None and req.eos_at < base + n_new:
                n_new = req.eos_at - base + 1
                reason = "stop"
            if base + n_new >= req.max_tokens:
                n_new = req.max_tokens - base
                reason = reason or "length"
            if req.num_tokens + n_new > self.config.max_model_len:
                n_new = max(self.config.max_model_len - req.num_tokens, 1)
                reason = reason or "length"
            tokens = req.tokens
            for k in range(base, base + n_new):
                tokens.append(token_at(req, k))
            req.num_output = base + n_new
            req.num_computed += min(accepted, n_new - 1)
            if base == 0:
                req.first_token_ts = now
            req.last_token_ts = now
            produced.append((req, n_new))
            if reason is not None:
                req.finish_reason = reason
                req.status = Status.FINISHED
                self.running.remove(req)
                self._free(req)
                finished.append(req)
        return produced, finished

    def _commit(self, req: SimRequest, upto: int) -> None:
        """Cache the request's full blocks among its first `upto` tokens."""
        full = upto // self.pool.block_size
        if full <= req.num_cached_blocks:
            return
        req.extend_hashes()
        blocks, hashes, lo = req.blocks, req.hashes, req.num_cached_blocks
        hi = min(full, len(blocks), len(hashes))
        if hi > lo:
            self.pool.cache_blocks(
                blocks[lo:hi], hashes[lo:hi], first=lo, parent=hashes[lo - 1] if lo else None,
                tokens=req.tokens, salt=req.salt,
            )
        req.num_cached_blocks = full
