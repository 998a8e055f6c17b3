"""Drives a workload against the target: closed loop at N concurrent requests, or open-loop Poisson arrivals."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from app.bench.client import BenchClient
from app.bench.progress import ProgressView
from app.bench.report import BenchResult, rescaled, summarize
from app.bench.spec import BenchSpec, RequestRecord
from app.bench.workloads import BenchRequest, Session, Workload, WorkloadOptions


class _Scheduler:
    """Hands out the next turn to send: a session waiting for its next turn first, else a new session."""

    def __init__(self, spec: BenchSpec, workload: Workload, model: str, t0: float) -> None:
        self.spec = spec
        self.workload = workload
        self.model = model
        self.t0 = t0
        self.limit = spec.request_bound()
        self.deadline = None if spec.duration_s is None else t0 + spec.duration_s
        self.ready: deque[Session] = deque()
        self.next_session = 0
        self.issued = 0
        self.records: list[RequestRecord] = []

    def exhausted(self) -> bool:
        """No more requests may be issued (count reached or time up)."""
        if self.limit is not None and self.issued >= self.limit:
            return True
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def issue(self) -> tuple[Session, BenchRequest, RequestRecord]:
        """The next request to send, counted as issued now (before any await, so limits hold exactly)."""
        if self.ready:
            session = self.ready.popleft()
        else:
            session = self.workload.session(self.next_session)
            self.next_session += 1
        req = session.next_request(self.model, self.spec.stream)
        if self.spec.extra_body:
            req.body.update(self.spec.extra_body)
        rec = RequestRecord(index=self.issued, session=req.session, turn=req.turn, tenant=req.tenant,
                            route_class=req.route_class, warmup=self.issued < self.spec.warmup)
        self.issued += 1
        self.records.append(rec)
        return session, req, rec


async def _send(
    sched: _Scheduler, client: BenchClient, issued: tuple[Session, BenchRequest, RequestRecord],
    on_done: Callable[[RequestRecord], None],
) -> None:
    session, req, rec = issued
    text = await client.send(req, rec, sched.t0)
    session.record_reply(text)
    if not session.done:
        sched.ready.append(session)
    on_done(rec)


async def _closed_loop(sched: _Scheduler, client: BenchClient, on_done: Callable[[RequestRecord], None]) -> None:
    async def worker() -> None:
        while not sched.exhausted():
            await _send(sched, client, sched.issue(), on_done)

    await asyncio.gather(*(worker() for _ in range(max(1, sched.spec.concurrency))))


async def _open_loop(sched: _Scheduler, client: BenchClient, on_done: Callable[[RequestRecord], None]) -> None:
    assert sched.spec.rate is not None and sched.spec.rate > 0
    rng = random.Random(f"arrivals-{sched.spec.seed}")
    inflight: set[asyncio.Task[None]] = set()
    next_at = time.perf_counter()
    while not sched.exhausted():
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
            if sched.exhausted():
                break
        if len(inflight) >= sched.spec.max_inflight:
            # Bound memory if the target falls far behind; arrivals resume as requests finish.
            await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            continue
        task = asyncio.create_task(_send(sched, client, sched.issue(), on_done))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        next_at += rng.expovariate(sched.spec.rate)
    if inflight:
        await asyncio.gather(*inflight)


async def run_bench(spec: BenchSpec) -> BenchResult:
    """Run one bench (one concurrency level or rate) and return every request's record plus the summary."""
    options = WorkloadOptions(seed=spec.seed, tenants=spec.tenants, api_keys=spec.api_keys, api_key=spec.api_key,
                              max_tokens=spec.max_tokens, mixed_ratio=spec.mixed_ratio,
                              class_header=spec.class_header, tool_choice=spec.tool_choice,
                              prompt_tokens=spec.prompt_tokens, tokenizer=spec.tokenizer)
    workload = Workload(spec.workload, options)
    connections = spec.concurrency if spec.rate is None else spec.max_inflight
    client = BenchClient(spec.base_url, connections + 4, spec.timeout_s, spec.api, spec.more_base_urls)
    try:
        model = spec.model or await client.first_model(options.key_for(0))
        t0 = time.perf_counter()
        sched = _Scheduler(spec, workload, model, t0)
        label = f"{spec.workload} " + (f"c={spec.concurrency}" if spec.rate is None else f"rate={spec.rate}/s")
        with ProgressView(label, sched.limit, spec.duration_s, enabled=spec.progress) as view:
            if spec.rate is None:
                await _closed_loop(sched, client, view.update)
            else:
                await _open_loop(sched, client, view.update)
        wall = time.perf_counter() - t0
    finally:
        await client.close()
    resolved = replace(spec, model=model, time_scale=1.0)
    result = BenchResult(spec=resolved, records=sched.records, summary=summarize(sched.records, wall, resolved))
    return rescaled(result, spec.time_scale)


async def run_sweep(spec: BenchSpec, levels: list[int]) -> list[BenchResult]:
    """Run the same bench at each concurrency level in turn."""
    return [await run_bench(replace(spec, concurrency=level)) for level in levels]
