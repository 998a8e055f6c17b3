"""Fresh random ids: a request's id when the client sends none, a lease's id in the store.

`uuid.uuid4().hex` builds a `uuid.UUID` (Python-level checks and an int round trip) for 32 hex digits; the same
digits straight from 16 random bytes took 0.62 µs against 1.87 µs (best of 5 runs of 100k, one process, the
shared 2-core machine at load average 1), and the request path makes two per request.
"""

from __future__ import annotations

import os


def uuid4_hex() -> str:
    """A random version-4 UUID as 32 lowercase hex digits, what `uuid.uuid4().hex` returns."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    return b.hex()
