from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config.peer_load import PeerLoadSettings


def test_a_ttl_shorter_than_two_rounds_is_refused() -> None:
    with pytest.raises(ValidationError, match="ttl_s must be at least twice interval_s"):
        PeerLoadSettings(interval_s=0.5, ttl_s=0.9)
    assert PeerLoadSettings(interval_s=0.5, ttl_s=1.0).ttl_s == 1.0
