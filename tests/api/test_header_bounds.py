"""The header bounds' `on_header` does uvicorn's own `on_header` work inline (app/api/header_bounds.py): the same
headers list and 100-continue flag for the same headers, so a uvicorn upgrade that changes it shows here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.header_bounds import HeaderBounds

HEADERS = [
    [(b"Host", b"gw"), (b"Content-Type", b"application/json"), (b"X-Api-Key", b"k")],
    [(b"expect", b"100-continue")],
    [(b"EXPECT", b"100-Continue"), (b"content-length", b"3")],
    [(b"Expect", b"nothing"), (b"x-kvgate-class", b"bulk")],
]


def protocol() -> Any:
    return SimpleNamespace(headers=[], expect_100_continue=False, _head_bytes=0, _head_count=0,
                           _max_bytes=1 << 20, _max_count=100)


@pytest.mark.parametrize("headers", HEADERS)
def test_on_header_keeps_what_uvicorns_on_header_keeps(headers: list[tuple[bytes, bytes]]) -> None:
    theirs, ours = protocol(), protocol()
    for name, value in headers:
        HttpToolsProtocol.on_header(theirs, name, value)
        HeaderBounds.on_header(ours, name, value)
    assert ours.headers == theirs.headers
    assert ours.expect_100_continue == theirs.expect_100_continue
    assert ours._head_count == len(headers)
    assert ours._head_bytes == sum(len(n) + len(v) + 4 for n, v in headers)
