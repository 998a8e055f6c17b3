"""Subscribe to every vLLM replica's KV events and keep the block index whole (or say it is not).

Transport (vLLM 0.32, vllm/distributed/kv_events.py): a PUB socket sends ``[topic, seq, EventBatch]``;
``seq`` counts from 0 per engine process, so a restart starts it again. A ROUTER replay socket answers
``[b"", start_seq]`` from a DEALER with every buffered batch ``seq >= start`` as ``[b"", topic, seq, payload]``
and ends with ``[b"", b"", -1, b""]`` (its buffer holds the last ``buffer_steps`` = 10,000 batches).

Two ways to reach a replica, chosen by the endpoint string as vLLM chooses for its own side:
- ``tcp://host:port`` (concrete host): the replica binds ``tcp://*:port``; we connect one SUB to it. A
  socket monitor tells connect/disconnect, so a dead stream is seen at once.
- ``tcp://*:port`` (wildcard): we bind one *collector* SUB there and replicas started with
  ``endpoint: tcp://<gateway>:port`` connect to it; their topics tell them apart (distinct topics required).

When is a replica *whole* (its overlap can be trusted)? When its transport is up, no replay is running,
its history is exact (every batch since the engine started or since an AllBlocksCleared was applied) and
it is not stale. vLLM sends no heartbeat, so *stale* means: the gateway sent it requests that must store new
blocks (`note_request(url, expected_new_blocks>0)`) at least `stale_after_s` ago and no batch came since.
After a gap that replay could not fill (buffer overrun, no replay endpoint, replay timeout) the replica's
blocks are forgotten, since removals may have been missed, and it is whole again only after
`resync_grace_s`: from then on it can only under-predict (cache hits are not announced again).

Bounded: SUB/DEALER high-water marks, a bounded pending buffer per replica while its replay runs, a
per-replica index capacity; nothing grows with traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from app.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventDecodeError,
    EventDecoder,
    decode_seq,
    event_hash,
)
from app.kvcache.index import KvIndex
from app.kvcache.replay import replay_round
from app.kvcache.sources import EventSource, ReplicaStats, _Stream

log = logging.getLogger(__name__)

SUB_HWM = 50_000


Listener = Callable[[str, bool, str], None]


class KvEventsHub:
    """All replicas' KV-event subscriptions, one block index, and whether each replica's view is whole."""

    def __init__(
        self,
        replicas: Sequence[EventSource | tuple[str, str, str | None]],
        *,
        index: KvIndex | None = None,
        stale_after_s: float = 30.0,
        resync_grace_s: float = 60.0,
        replay_timeout_s: float = 2.0,
        on_change: Listener | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        sources = [r if isinstance(r, EventSource) else EventSource(r[0], r[1], r[2]) for r in replicas]
        self.index = index if index is not None else KvIndex()
        self.stale_after_s = stale_after_s
        self.resync_grace_s = resync_grace_s
        self.replay_timeout_s = replay_timeout_s
        self.fallbacks = 0
        self._on_change = on_change
        self._clock = clock
        self._decoder = EventDecoder.create()
        self._streams: dict[str, _Stream] = {}
        self._by_socket: dict[str, dict[bytes, _Stream]] = {}
        self._ctx: zmq.asyncio.Context | None = None
        # Per socket key: its tasks and sockets (a replica added or removed at run time opens or closes its own).
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._sockets: dict[str, list[zmq.asyncio.Socket]] = {}
        # Tasks of removed replicas, cancelled at once and awaited at stop().
        self._ended: list[asyncio.Task[None]] = []
        for src in sources:
            self._register(src)

    def _register(self, s: EventSource) -> str:
        if s.url in self._streams:
            raise ValueError(f"replica {s.url} listed twice")
        key = s.endpoint if s.collector else f"{s.url}|{s.endpoint}"
        topics = self._by_socket.setdefault(key, {})
        if s.topic.encode() in topics:
            raise ValueError(f"replicas sharing collector {s.endpoint} need distinct topics ({s.topic!r} twice)")
        self._streams[s.url] = topics[s.topic.encode()] = _Stream(s)
        return key

    # ---- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the sockets and start receiving; returns at once (catch-up runs in the background)."""
        if self._ctx is not None:
            return
        self._ctx = zmq.asyncio.Context()
        for key in self._by_socket:
            self._open(key)

    def _open(self, key: str) -> None:
        assert self._ctx is not None
        topics = self._by_socket[key]
        first = next(iter(topics.values()))
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, SUB_HWM)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)  # a discovered replica may have an IPv6 address
        for topic in topics:
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        sockets, tasks = self._sockets.setdefault(key, []), self._tasks.setdefault(key, [])
        if first.source.collector:
            sock.bind(first.source.endpoint)
            for stream in topics.values():
                # A collector cannot tell which peer disconnected: staleness and seq checks stand in.
                stream.connected = True
                self._start_replay(stream, None)
        else:
            monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            sockets.append(monitor)
            tasks.append(asyncio.create_task(self._watch(monitor, first), name=f"kv-monitor {key}"))
            sock.connect(first.source.endpoint)
        sockets.append(sock)
        tasks.append(asyncio.create_task(self._receive(sock, topics), name=f"kv-sub {key}"))

    def add(self, source: EventSource) -> None:
        """Subscribe to a replica that appeared (discovery); its view is whole once connected and caught up."""
        if source.url in self._streams:
            return
        if source.collector:
            raise ValueError(f"{source.url}: a replica added at run time needs its own endpoint, not {source.endpoint}")
        key = self._register(source)
        if self._ctx is not None:
            self._open(key)

    def follow(self, sources: Sequence[EventSource]) -> None:
        """Subscribe to exactly `sources` from now on (after discovery changed a pool): add new, remove gone."""
        wanted = {s.url: s for s in sources}
        for url in [u for u, st in self._streams.items() if wanted.get(u) != st.source]:
            self.remove(url)
        for src in wanted.values():
            self.add(src)

    def remove(self, url: str) -> None:
        """Drop the subscription of a replica that vanished, and its blocks (its tasks end in the background)."""
        stream = self._streams.pop(url, None)
        if stream is None:
            return
        self._ended = [t for t in self._ended if not t.done()]
        key = next(k for k, topics in self._by_socket.items() if stream in topics.values())
        topics = self._by_socket[key]
        del topics[stream.source.topic.encode()]
        if not topics:  # the replica's own socket (a collector socket stays for the replicas still on it)
            del self._by_socket[key]
            for t in self._tasks.pop(key, []):
                t.cancel()
                self._ended.append(t)
            for sock in self._sockets.pop(key, []):
                sock.close(linger=0)
        if stream.replay_task is not None:
            stream.replay_task.cancel()
            self._ended.append(stream.replay_task)
        self.index.clear(url)

    async def stop(self) -> None:
        """Cancel the tasks and close every socket."""
        tasks = [t for ts in self._tasks.values() for t in ts] + self._ended
        tasks += [s.replay_task for s in self._streams.values() if s.replay_task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self._ended.clear()
        for socks in self._sockets.values():
            for sock in socks:
                sock.close(linger=0)
        self._sockets.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # ---- what the routing policy reads -----------------------------------------------------------

    def is_whole(self, url: str) -> bool:
        """True when `url`'s index view can be trusted (see the module docstring); unknown urls are not."""
        stream = self._streams.get(url)
        if stream is None:
            return False
        reason = self._not_whole_reason(stream)
        whole = reason == ""
        if whole != stream.whole_cache or reason != stream.stats.not_whole_reason:
            stream.whole_cache = whole
            stream.stats.not_whole_reason = reason
            if self._on_change is not None:
                self._on_change(url, whole, reason)
        return whole

    def overlap_blocks(self, url: str, hashes: Sequence[int]) -> int:
        """Leading blocks of `hashes` that `url` holds (any medium), per the index."""
        return self.index.overlap(url, hashes)

    def note_request(self, url: str, expected_new_blocks: int) -> None:
        """Tell the hub a request went to `url` that must store blocks: if no batch follows, the stream is stale."""
        stream = self._streams.get(url)
        if stream is not None and expected_new_blocks > 0 and stream.owed_since is None:
            stream.owed_since = self._clock()

    def block_size(self, url: str) -> int | None:
        """Tokens per KV block as `url`'s own events say (None before its first BlockStored, or unknown url)."""
        stream = self._streams.get(url)
        return stream.stats.block_size if stream is not None else None

    def record_fallback(self) -> None:
        """Count one pick that fell back because a candidate was not whole."""
        self.fallbacks += 1

    def stats(self, url: str) -> ReplicaStats:
        """Counters for one replica."""
        return self._streams[url].stats

    def urls(self) -> list[str]:
        """Replicas the hub subscribes to."""
        return list(self._streams)

    def index_size(self) -> int:
        """Blocks held in the index over all replicas."""
        return self.index.size()

    def _not_whole_reason(self, s: _Stream) -> str:
        if not s.connected:
            return "disconnected"
        if s.replaying:
            return "replaying"
        now = self._clock()
        if not s.exact and (s.approx_since is None or now - s.approx_since < self.resync_grace_s):
            return "gapped"
        if s.owed_since is not None and now - s.owed_since >= self.stale_after_s:
            return "stale"
        return ""

    # ---- receiving -------------------------------------------------------------------------------

    async def _watch(self, monitor: zmq.asyncio.Socket, stream: _Stream) -> None:
        while True:
            msg = parse_monitor_message(await monitor.recv_multipart())
            if msg["event"] == zmq.EVENT_CONNECTED:
                stream.connected = True
                # Anything published while we were away is lost on PUB/SUB: catch up (and detect a restart).
                self._start_replay(stream, stream.stats.last_seq)
            elif msg["event"] == zmq.EVENT_DISCONNECTED:
                stream.connected = False

    async def _receive(self, sock: zmq.asyncio.Socket, topics: dict[bytes, _Stream]) -> None:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                continue
            stream = topics.get(frames[0])
            if stream is None:  # ZMQ topic filters match prefixes; ours must match exactly
                continue
            seq = decode_seq(frames[1])
            if stream.replaying:
                # Bounded: when full the oldest drops out, which the drain sees as a gap and replays.
                stream.pending.append((seq, frames[2]))
                continue
            self._on_live(stream, seq, frames[2])

    def _on_live(self, s: _Stream, seq: int, payload: bytes) -> None:
        last = s.stats.last_seq
        if last is not None and seq <= last:
            batch = self._decode(s, payload)
            if batch is not None and s.last_ts is not None and batch.ts > s.last_ts:
                self._restarted(s)  # seq went back but time went on: a new engine process
                self._on_live(s, seq, payload)
            else:
                s.stats.duplicates += 1
            return
        if last is None:
            if seq == 0:
                s.exact = True  # the engine's very first batch, on an empty index: nothing was missed
                s.approx_since = None
                self._apply(s, seq, payload)
            elif s.approx_since is not None:
                self._apply(s, seq, payload)  # already resumed approximately: take what comes
            else:
                self._start_replay(s, None)
                s.pending.append((seq, payload))
            return
        if seq == last + 1:
            self._apply(s, seq, payload)
            return
        s.stats.gaps += 1
        self._start_replay(s, last)
        s.pending.append((seq, payload))

    def _restarted(self, s: _Stream) -> None:
        s.stats.restarts += 1
        self.index.clear(s.source.url)
        s.stats.last_seq = None
        s.last_ts = None
        s.exact = False

    def _decode(self, s: _Stream, payload: bytes) -> EventBatch | None:
        try:
            return self._decoder.decode(payload)
        except EventDecodeError:
            s.stats.decode_errors += 1
            return None

    def _apply(self, s: _Stream, seq: int, payload: bytes, batch: EventBatch | None = None) -> None:
        if batch is None:
            batch = self._decode(s, payload)
        s.stats.last_seq = seq
        s.last_event_at = self._clock()
        s.owed_since = None
        if batch is None:
            return
        s.last_ts = batch.ts
        st = s.stats
        st.batches += 1
        st.events += len(batch.events)
        st.skipped_events += batch.skipped
        lag = max(0.0, time.time() - batch.ts)
        st.lag_s = lag
        st.max_lag_s = max(st.max_lag_s, lag)
        url = s.source.url
        index = self.index
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                index.store(url, [event_hash(h) for h in ev.block_hashes], ev.medium)
                if ev.block_size > 0:
                    st.block_size = ev.block_size
            elif isinstance(ev, BlockRemoved):
                index.remove(url, [event_hash(h) for h in ev.block_hashes], ev.medium)
            elif isinstance(ev, AllBlocksCleared):
                index.clear(url)
                s.exact = True  # both sides are empty now: the view is exact again

    # ---- replay ------------------------------------------------------------------------------------

    def _start_replay(self, s: _Stream, anchor: int | None) -> None:
        """Catch up from `anchor` (the last applied seq, re-fetched to check it is the same engine), or from 0."""
        if s.replaying or self._ctx is None:
            return
        s.replaying = True
        s.replay_task = asyncio.create_task(self._replay(s, anchor), name=f"kv-replay {s.source.url}")

    async def _replay(self, s: _Stream, anchor: int | None) -> None:
        result = "failed"
        try:
            for _ in range(3):
                if self._ctx is None:  # stopped meanwhile
                    return
                result = await replay_round(self._ctx, s, anchor, self.replay_timeout_s, self._decode, self._apply)
                if result == "restart":
                    self._restarted(s)
                    anchor = None
                elif result == "hole":
                    anchor = s.stats.last_seq
                else:
                    break
            if result != "ok":
                self._unrecoverable(s)
        finally:
            s.replaying = False
            s.replay_task = None
        self._drain_pending(s)

    def _unrecoverable(self, s: _Stream) -> None:
        s.stats.unrecoverable += 1
        self.index.clear(s.source.url)
        s.exact = False
        s.approx_since = self._clock()
        s.stats.last_seq = None  # resume at whatever comes next (see _on_live)
        s.last_ts = None
        log.warning("kv events for %s: gap could not be replayed; index cleared", s.source.url)

    def _drain_pending(self, s: _Stream) -> None:
        items = sorted(s.pending, key=lambda p: p[0])
        s.pending.clear()
        for i, (seq, payload) in enumerate(items):
            if s.replaying:  # a new gap started another replay: keep the rest for after it
                s.pending.extend(items[i:])
                return
            self._on_live(s, seq, payload)
