"""The engine loop: one scheduled step at a time, each lasting what the profile says (÷ time-scale)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from app.kvcache.hashing import HashAlgo
from app.kvcache.publisher import BUFFER_STEPS, KvEventPublisher
from app.sim.kv_cache import DEFAULT_HASH_ALGO, BlockPool
from app.sim.metrics import EngineMetrics
from app.sim.profiles import Profile, StepCost
from app.sim.request import SimRequest, Status
from app.sim.scheduler import Scheduler, SchedulerConfig
from app.sim.steptrace import StepTrace

OUTPUT_TABLE_LEN = 8192
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine needs besides the tokenizer."""

    profile: Profile
    scheduler: SchedulerConfig
    kv_blocks: int
    block_size: int = 16
    time_scale: float = 1.0
    seed: int = 0
    enable_prefix_caching: bool = True
    mean_output_tokens: int = 256  # natural length (EOS) when ignore_eos is off
    model_name: str = "sim"
    hash_algo: HashAlgo = DEFAULT_HASH_ALGO  # vLLM's --prefix-caching-hash-algo
    kv_events: str | None = None  # PUB endpoint of vLLM's --kv-events-config (None: no events)
    kv_replay: str | None = None  # its ROUTER replay endpoint
    kv_topic: str = ""
    kv_buffer_steps: int = BUFFER_STEPS
    step_trace: bool = False  # record every step and each request's way to its first token (app.sim.steptrace)


class OutputStream:
    """What one API request (its n sequences) has produced and not yet sent; the handler waits on `event`."""

    __slots__ = ("closed", "done", "event", "n", "pending", "reqs", "sink")

    def __init__(self, n: int, sink: Callable[[int, int, int], None] | None = None) -> None:
        self.event = asyncio.Event()
        self.closed = False  # the client went away; the handler stops
        # With a sink, output goes straight to it from the engine loop (choice, first index, count) and
        # `event` fires only when every choice has finished; without one, it is buffered in `pending`.
        self.sink = sink
        self.pending: list[tuple[int, int, int]] = []  # (choice index, first output index, count)
        self.done = 0
        self.n = n
        self.reqs: list[SimRequest] = []

    def push(self, index: int, req: SimRequest, count: int) -> None:
        """Called by the engine after a step: `count` new tokens for choice `index`."""
        if req.status is Status.FINISHED:
            self.done += 1
        if self.sink is not None:
            self.sink(index, req.num_output - count, count)
            if self.done >= self.n:
                self.event.set()
            return
        self.pending.append((index, req.num_output - count, count))
        self.event.set()

    def drain(self) -> list[tuple[int, int, int]]:
        """Take what is pending."""
        items = self.pending
        self.pending = []
        self.event.clear()
        return items

    @property
    def finished(self) -> bool:
        """Every choice has finished."""
        return self.done >= self.n


def _push_choice(stream: OutputStream, index: int, req: SimRequest, count: int) -> None:
    stream.push(index, req, count)


class Engine:
    """Owns the scheduler and block pool; runs steps in an asyncio task; feeds OutputStreams and metrics."""

    def __init__(self, config: EngineConfig, vocab: Sequence[tuple[int, str]], eos_token_id: int) -> None:
        self.config = config
        self.pool = BlockPool(
            config.kv_blocks,
            block_size=config.block_size,
            enable_caching=config.enable_prefix_caching,
            hash_algo=config.hash_algo,
            record_events=config.kv_events is not None,
        )
        self.publisher: KvEventPublisher | None = None
        self.scheduler = Scheduler(config.scheduler, self.pool, seed=config.seed)
        self.metrics = EngineMetrics(config.model_name, max_model_len=config.scheduler.max_model_len)
        self.eos_token_id = eos_token_id
        rng = random.Random(config.seed)
        picks = [rng.randrange(len(vocab)) for _ in range(OUTPUT_TABLE_LEN)]
        # The seeded output stream: token id and text per position, so a token costs two list lookups.
        self.out_ids = [vocab[p][0] for p in picks]
        self.out_text = [vocab[p][1] for p in picks]
        self.out_json = [orjson.dumps(t) for t in self.out_text]  # per-position JSON literal, for streaming
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._seq = 0
        self.healthy = True
        self.trace: StepTrace | None = StepTrace() if config.step_trace else None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Bind the KV-event sockets (if configured) and start the loop task."""
        cfg = self.config
        if cfg.kv_events is not None and self.publisher is None:
            self.publisher = KvEventPublisher(
                cfg.kv_events, cfg.kv_replay, topic=cfg.kv_topic, buffer_steps=cfg.kv_buffer_steps
            )
            self.publisher.start()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="sim-engine")
            self._task.add_done_callback(self._on_loop_exit)

    def _on_loop_exit(self, task: asyncio.Task[None]) -> None:
        # A dead engine makes /health answer 503, as vLLM's does.
        if not task.cancelled() and task.exception() is not None:
            self.healthy = False
            log.error("sim engine loop died", exc_info=task.exception())

    async def stop(self) -> None:
        """Cancel the loop task and close the KV-event sockets."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.publisher is not None:
            await self.publisher.close()
            self.publisher = None

    def publish_events(self) -> None:
        """Send the KV events recorded since the last batch as one EventBatch (vLLM: once per engine step)."""
        events = self.pool.take_events()
        if events and self.publisher is not None:
            self.publisher.publish(events)

    # ------------------------------------------------------------- requests
    def sequence_plan(
        self, seed: int | None, prompt: Sequence[int], index: int, ignore_eos: bool, resume: Sequence[int] = ()
    ) -> tuple[int, int | None]:
        """(offset into the output stream, EOS position or None) for one choice: a pure function of seed/prompt.

        A seeded sequence whose prompt ends with the first tokens it would produce (`resume`: an open assistant
        turn) goes on after them, as a deterministic model continues its own text.
        """
        if seed is None:
            key = hashlib.blake2b(repr((self.config.seed, tuple(prompt), index)).encode(), digest_size=8).digest()
        else:
            key = hashlib.blake2b(repr((seed, index)).encode(), digest_size=8).digest()
        rng = random.Random(int.from_bytes(key, "little"))
        offset = rng.randrange(OUTPUT_TABLE_LEN)
        eos_at = None if ignore_eos else 1 + int(rng.expovariate(1.0 / max(self.config.mean_output_tokens, 1)))
        k = len(resume)
        if seed is not None and k and all(self.out_ids[(offset + j) % OUTPUT_TABLE_LEN] == t
                                          for j, t in enumerate(resume)):
            offset = (offset + k) % OUTPUT_TABLE_LEN
            eos_at = None if eos_at is None else max(eos_at - k, 1)
        return offset, eos_at

    def submit(
        self,
        rid: str,
        prompt: list[int],
        *,
        n: int,
        max_tokens: int,
        seed: int | None,
        ignore_eos: bool,
        salt: str | None,
        priority: int,
        sink: Callable[[int, int, int], None] | None = None,
        resume: Sequence[int] = (),
        accept: float = -1.0,
    ) -> OutputStream:
        """Queue n sequences for one API request; their tokens arrive on the returned stream (or its sink)."""
        stream = OutputStream(n, sink)
        now = time.monotonic()
        for i in range(n):
            offset, eos_at = self.sequence_plan(seed, prompt, i, ignore_eos, resume)
            self._seq += 1
            req = SimRequest(
                rid if n == 1 else f"{rid}_{i}",
                prompt,
                max_tokens=max_tokens,
                eos_at=eos_at,
                salt=salt,
                priority=priority,
                arrival=now,
                seq=self._seq,
                out_offset=offset,
                emit=functools.partial(_push_choice, stream, i),
                block_size=self.pool.block_size,
                algo=self.pool.hash_algo,
                accept=accept,
            )
            stream.reqs.append(req)
        delay = self.config.profile.request_overhead_s / self.config.time_scale
        if delay > 0:
            # The API server's share of TTFT (render, tokenize, hand-off): the engine sees the request later.
            asyncio.get_running_loop().call_later(delay, self._enqueue, stream)
        else:
            self._enqueue(stream)
        return stream

    def _enqueue(self, stream: OutputStream) -> None:
        trace = self.trace
        for req in stream.reqs:
            if req.status is not Status.FINISHED:  # not aborted in the meantime
                self.scheduler.add(req)
                if trace is not None:
                    trace.enqueued(id(req), req.rid, req.arrival, time.monotonic(), req.num_prompt)
        self._wake.set()

    def abort(self, stream: OutputStream) -> None:
        """Abort every unfinished sequence of a request (client went away): frees their KV blocks now."""
        now = time.monotonic()
        stream.closed = True
        for req in stream.reqs:
            if req.status is not Status.FINISHED:
                self.scheduler.abort(req)
                self._observe_finished(req, now)
                if self.trace is not None:
                    self.trace.dropped(id(req))
        stream.event.set()

    def token_at(self, req: SimRequest, k: int) -> int:
        """The k-th output token id of a sequence."""
        if k == req.eos_at:
            return self.eos_token_id
        return self.out_ids[(req.out_offset + k) % OUTPUT_TABLE_LEN]

    def text_of(self, req: SimRequest, start: int, count: int) -> str:
        """Detokenized text of output tokens [start, start+count) (EOS renders as nothing)."""
        table, base, eos = self.out_text, req.out_offset, req.eos_at
        return "".join(
            table[(base + k) % OUTPUT_TABLE_LEN] for k in range(start, start + count) if k != eos
        )

    def json_text_of(self, req: SimRequest, start: int, count: int) -> bytes:
        """The same text as a JSON string literal; one step's single token costs a list lookup."""
        if count == 1 and start != req.eos_at:
            return self.out_json[(req.out_offset + start) % OUTPUT_TABLE_LEN]
        return orjson.dumps(self.text_of(req, start, count))

    def reset_prefix_cache(self) -> bool:
        """vLLM's /reset_prefix_cache: drop cached blocks (refused while blocks are in use)."""
        ok = self.pool.reset()
        # vLLM publishes AllBlocksCleared with its next step; an idle engine may not step for a while, and a
        # subscriber would keep routing on blocks that are gone, so the sim sends it now.
        self.publish_events()
        return ok

    # ----------------------------------------------------------------- loop
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        sched, profile, m = self.scheduler, self.config.profile, self.metrics
        scale = self.config.time_scale
        prev_end = prev_after = 0.0
        while True:
            if not sched.has_work():
                prev_end = 0.0  # idle: the next step starts when work arrives
                await self._wake.wait()
                self._wake.clear()
                continue
            # Output processing overlaps the next forward pass (vLLM runs them in separate processes), so a
            # busy engine's step starts where the previous one ended; an idle one starts now.
            now_l = loop.time()
            t0 = prev_end if prev_end and now_l - prev_end < 0.25 else now_l
            batch = sched.schedule(time.monotonic())
            if not batch:
                prev_end = 0.0
                # Only possible when the head request cannot fit even an empty cache; wait for an abort.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.05)
                continue
            m.iteration.observe(sum(s.num_new for s in batch))
            cost = sched.step_cost(batch)
            dt = profile.step_time(cost)
            # Before the step runs: which of its requests are prefilling (after it, they have a token).
            prefills, scheduled_at = None, 0.0
            if self.trace is not None:
                # time.monotonic, not loop.time: uvloop's clock has millisecond steps, the request times do not.
                prefills = [s.req for s in batch if s.req.num_tokens - s.req.num_computed != 1]
                scheduled_at = time.monotonic()
            m.modeled_s += dt
            end = t0 + dt / scale
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let the HTTP side run even when the model says "instant"
            after = loop.time()
            if t0 == prev_end:
                # How much longer this step took on the wall than modeled (host CPU saturation).
                m.lateness_s += max(after - prev_after - dt / scale, 0.0)
            prev_end, prev_after = end, after
            now = time.monotonic()
            index = sched.counters.steps
            produced, finished = sched.finish_step(batch, self.token_at, now)
            if self.trace is not None and prefills is not None:
                self._trace_step(self.trace, index, prefills, produced, (scheduled_at, t0, dt, now), cost)
            self.publish_events()
            self._observe(produced, finished, now)
            for req, count in produced:
                if req.emit is not None:
                    try:
                        req.emit(req, count)
                    except Exception:
                        # A broken consumer must not stop the engine: drop that request.
                        log.exception("output consumer failed; aborting %s", req.rid)
                        for stream in self._streams_of(req):
                            self.abort(stream)

    def _trace_step(self, trace: StepTrace, index: int, prefills: list[SimRequest],
                    produced: list[tuple[SimRequest, int]], times: tuple[float, float, float, float],
                    cost: StepCost) -> None:
        scheduled_at, start, modeled_s, ended_at = times
        for req in prefills:
            trace.scheduled(id(req), index, scheduled_at, max(req.cached_tokens, 0))
        for req, count in produced:
            if req.num_output == count:
                trace.first_token(id(req), index, ended_at)
        trace.step(index, scheduled_at, start, modeled_s, ended_at, len(prefills), cost.prefill_tokens,
                   cost.decode_seqs, len(self.scheduler.waiting))

    def _streams_of(self, req: SimRequest) -> list[OutputStream]:
        emit = req.emit
        if isinstance(emit, functools.partial) and isinstance(emit.args[0], OutputStream):
            return [emit.args[0]]
        return []

    def _observe(self, produced: list[tuple[SimRequest, int]], finished: list[SimRequest], now: float) -> None:
        m = self.metrics
        gen = 0
        for req, count in produced:
            gen += count
            if req.num_output == count:
                m.ttft.observe(req.first_token_ts - req.arrival)
                m.prompt_tokens += req.num_prompt
                m.prompt_tokens_cached += max(req.cached_tokens, 0)
        m.generation_tokens += gen
        # Every sequence that decoded this step saw the same inter-token gap; one weighted observation.
        decoding = sum(1 for req, count in produced if req.num_output > count)
        if decoding and self._last_step_end:
            m.itl.observe(now - self._last_step_end, decoding)
        self._last_step_end = now
        for req in finished:
            self._observe_finished(req, now)

    _last_step_end = 0.0

    def _observe_finished(self, req: SimRequest, now: float) -> None:
        m = self.metrics
        m.success[req.finish_reason or "abort"] = m.success.get(req.finish_reason or "abort", 0) + 1
        m.e2e.observe(now - req.arrival)
        m.req_prompt.observe(req.num_prompt)
        m.req_gen.observe(req.num_output)
        m.req_max_tokens.observe(req.max_tokens)
        m.req_preemptions.observe(req.num_preemptions)
        if req.cached_tokens >= 0:
            m.req_kv_computed.observe(req.num_prompt - req.cached_tokens)
        if req.scheduled_ts:
            m.queue.observe(req.scheduled_ts - req.arrival)
            m.inference.observe(max(req.last_token_ts, req.scheduled_ts) - req.scheduled_ts)
        if req.first_token_ts:
            m.prefill.observe(req.first_token_ts - req.scheduled_ts)
            m.decode.observe(req.last_token_ts - req.first_token_ts)
            if req.num_output > 1:
                m.tpot.observe((req.last_token_ts - req.first_token_ts) / (req.num_output - 1))
