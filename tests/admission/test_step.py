from typing import Any

import pytest

from app.admission.step import output_cap
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
def test_the_queue_charges_the_output_cap_the_limits_stage_reserves(body: dict[str, Any],
                                                                    fields: tuple[str, ...]) -> None:
    assert output_cap(body, fields) == max_output_tokens(body, fields)
