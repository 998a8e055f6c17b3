"""app/ids.py: the ids are what uuid.uuid4().hex gives."""

from __future__ import annotations

import uuid

from app.ids import uuid4_hex


def test_uuid4_hex_is_a_version_4_rfc_4122_uuid_in_32_lowercase_hex_digits() -> None:
    for _ in range(1000):
        value = uuid4_hex()
        parsed = uuid.UUID(value)
        assert parsed.hex == value
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)


def test_uuid4_hex_does_not_repeat() -> None:
    assert len({uuid4_hex() for _ in range(10_000)}) == 10_000
