"""Backoff between upstream attempts: exponential, capped, with full jitter (so retries do not align)."""

from __future__ import annotations

import random

BASE_S = 0.05
CAP_S = 1.0


def backoff_s(attempt: int, rng: random.Random, *, base_s: float = BASE_S, cap_s: float = CAP_S) -> float:
    """Seconds to wait before retry number `attempt` (1 = first retry): uniform in [0, min(cap, base·2^(n-1))]."""
    if attempt < 1:
        return 0.0
    # Cap the exponent first: 2**attempt for a large attempt would be a huge int for nothing.
    ceiling = min(cap_s, base_s * (2 ** min(attempt - 1, 32)))
    return rng.uniform(0.0, ceiling)
