"""One catch-up round trip with a replica's replay endpoint (vLLM's ROUTER socket, see app/kvcache/subscriber.py).

A DEALER sends ``[b"", start_seq]``; the replica answers every buffered batch ``seq >= start`` as
``[b"", topic, seq, payload]`` and ends with ``[b"", b"", -1, b""]``. The round trip classifies what it saw, so
the hub can decide: 'ok' (caught up), 'restart' (a younger engine), 'hole' (frames dropped: retry),
'lost' (the buffer no longer reaches back to us) or 'failed' (no replay endpoint, timeout).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq
import zmq.asyncio

from app.kvcache.events import END_SEQ, EventBatch, decode_seq, encode_seq
from app.kvcache.sources import _Stream

REPLAY_HWM = 20_000


async def replay_round(
    ctx: zmq.asyncio.Context,
    s: _Stream,
    anchor: int | None,
    timeout_s: float,
    decode: Callable[[_Stream, bytes], EventBatch | None],
    apply: Callable[[_Stream, int, bytes], None],
) -> str:
    """Fetch from `anchor` (the last applied seq, re-fetched to check it is the same engine), or from 0."""
    if s.source.replay is None:
        return "failed"
    s.stats.replays += 1
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVHWM, REPLAY_HWM)
    dealer.setsockopt(zmq.IPV6, 1)
    try:
        dealer.connect(s.source.replay)
        await dealer.send_multipart([b"", encode_seq(0 if anchor is None else anchor)])
        expect: int | None = None
        while True:
            try:
                frames = await asyncio.wait_for(dealer.recv_multipart(), timeout_s)
            except TimeoutError:
                s.stats.replay_failures += 1
                return "failed"
            if len(frames) != 4:
                continue
            seq = decode_seq(frames[2])
            if seq == END_SEQ:
                if expect is None:
                    if anchor is not None:
                        return "restart"  # the buffer does not hold our last seq: a younger engine
                    s.exact = True  # the engine has published nothing yet
                    s.approx_since = None
                return "ok"
            if expect is None:
                if anchor is not None:
                    # Re-fetch our last batch: same seq and timestamp means the same engine process.
                    if seq > anchor:
                        return "lost"
                    batch = decode(s, frames[3])
                    if seq < anchor or batch is None or batch.ts != s.last_ts:
                        return "restart"
                    expect = anchor + 1
                    continue
                if seq != 0:
                    return "lost"
                s.exact = True
                s.approx_since = None
                expect = 0
            if seq != expect:
                return "hole"  # the ROUTER dropped frames (its send HWM): retry from where we are
            apply(s, seq, frames[3])
            expect = seq + 1
    finally:
        dealer.close(linger=0)
