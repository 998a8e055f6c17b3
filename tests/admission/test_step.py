from typing import Any

import pytest

from app.limits import OUTPUT_CAP_FIELDS, max_output_tokens

BODIES: list[dict[str, Any]] = [
    {},
    {"max_tokens": 16},
    {"max_tokens": 0, "max_completion_tokens": 9},
    {"max_completion_tokens": 9, "max_tokens": 16},
    {"max_tokens": None, "max_output_tokens": 5},
    {"max_tokens": -3},
    {"max_tokens": 16, "n": 3},
    {"max_tokens": 16, "n": 0},
    {"max_tokens": 16, "n": -2},
    {"max_tokens": 16, "n": "2"},
    {"max_tokens": "16"},
    {"max_tokens": 16.0},
    {"max_tokens": True, "n": True},
    {"max_tokens": [1]},
]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("fields", [OUTPUT_CAP_FIELDS, ("max_tokens",), ("max_output_tokens", "max_tokens"), ()])
def test_the_output_cap_loop_answers_as_the_generator_it_replaced(body: dict[str, Any],
                                                                  fields: tuple[str, ...]) -> None:
    # The form max_output_tokens had before its loop (a hot-path rewrite: limits and the queue both charge it).
    cap = next((body[f] for f in fields if body.get(f)), 0)
    n = body.get("n") or 1
    want = max(cap, 0) * max(n, 1) if isinstance(cap, int) and isinstance(n, int) else 0
    assert max_output_tokens(body, fields) == want
