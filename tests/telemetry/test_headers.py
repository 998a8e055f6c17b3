"""Cost and overhead as the client sees them: headers, the stream's usage extension and SSE trailer."""

from __future__ import annotations

import pytest

from app.context import Timing
from app.cost import COST_HEADER
from app.surfaces import CHAT
from app.telemetry.headers import (
    OVERHEAD_HEADER,
    overhead_s,
    response_headers,
    sse_trailer,
)


def test_overhead_is_wall_time_minus_upstream_time() -> None:
    timing = Timing(start=1.0, upstream_start=1.001, end=1.5, upstream_busy=0.498)
    assert overhead_s(timing) == pytest.approx((1.5 - 1.0) - 0.498)


def test_overhead_uses_now_while_the_request_runs_and_never_goes_negative() -> None:
    running = Timing(start=2.0, upstream_busy=0.0)
    assert overhead_s(running, now=2.25) == pytest.approx(0.25)
    assert overhead_s(Timing(start=1.0, end=1.1, upstream_busy=0.5)) == 0.0


def test_response_headers_carry_cost_and_overhead_as_plain_numbers() -> None:
    headers = response_headers(1.234e-7, 0.000412)
    assert float(headers[COST_HEADER]) == pytest.approx(1.234e-7, abs=1e-10)
    assert float(headers[OVERHEAD_HEADER]) == pytest.approx(0.412)


def test_sse_trailer_is_comment_lines_ending_an_event() -> None:
    trailer = sse_trailer(0.5, 0.002).decode()
    assert trailer.endswith("\n\n")
    lines = trailer.strip("\n").split("\n")
    assert all(line.startswith(": ") for line in lines)
    fields = dict(line[2:].split(" ", 1) for line in lines)
    assert float(fields[COST_HEADER]) == pytest.approx(0.5)
    assert float(fields[OVERHEAD_HEADER]) == pytest.approx(2.0)


def test_openai_streams_end_with_the_trailer_then_done() -> None:
    from tests.store.helpers import make_ctx

    observer = CHAT.stream_observer(make_ctx(), "m")
    ending = observer.ending(sse_trailer(0.5, 0.002))
    assert ending.startswith(b": " + COST_HEADER.encode())
    assert ending.endswith(b"\n\ndata: [DONE]\n\n")
