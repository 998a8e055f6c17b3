"""What a client sees of cost and gateway overhead: header values, and their stream equivalents.

Non-streaming responses carry `x-kvgate-cost-usd` and `x-kvgate-overhead-ms` as headers. A stream's
headers leave before its usage is known, so a stream ends with both figures in SSE comment lines
(`: <header name> <value>`) right before its end marker (`data: [DONE]` on OpenAI's streams):

    : x-kvgate-cost-usd 0.0000123400
    : x-kvgate-overhead-ms 0.412

SSE comment lines are ignored by conforming clients (the OpenAI SDKs included), so the trailer is safe to
send on every stream.
"""

from __future__ import annotations

import time

from app.context import Timing
from app.cost import COST_HEADER, format_usd
from app.headers import OVERHEAD_MS

OVERHEAD_HEADER = OVERHEAD_MS


def overhead_s(timing: Timing, now: float | None = None) -> float:
    """The gateway's own time for a request: wall time minus the time spent waiting on the upstream.

    `now` stands in for `timing.end` while the request is still running (a header written before the end).
    """
    end = timing.end or (time.perf_counter() if now is None else now)
    return max((end - timing.start) - timing.upstream_busy, 0.0)


def format_ms(seconds: float) -> str:
    """Seconds as the `x-kvgate-overhead-ms` header shows them (milliseconds, 3 decimals)."""
    return f"{seconds * 1000.0:.3f}"


def response_headers(cost_usd: float, overhead_seconds: float) -> dict[str, str]:
    """The cost and overhead headers of a non-streaming response."""
    return {COST_HEADER: format_usd(cost_usd), OVERHEAD_HEADER: format_ms(overhead_seconds)}


def sse_trailer(cost_usd: float, overhead_seconds: float) -> bytes:
    """The SSE comment lines a stream sends before `data: [DONE]`, carrying cost and overhead."""
    return (
        f": {COST_HEADER} {format_usd(cost_usd)}\n: {OVERHEAD_HEADER} {format_ms(overhead_seconds)}\n\n"
    ).encode()
