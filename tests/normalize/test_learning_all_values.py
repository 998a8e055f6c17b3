"""A `key=value; key=value` line whose every value changes per request is learned within three requests."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from app.normalize import VolatilityMemory, normalize
from app.surfaces import CHAT, MESSAGES, RESPONSES, Surface
from tests.normalize.helpers import NOW, STATIC_SYSTEM, model, tenant


def billing(rng: random.Random, i: int) -> str:
    """Claude Code's billing line with the version and the nonce both new on each request."""
    return (f"x-anthropic-billing-header: cc_version=2.1.3{i}.{rng.randrange(16**3):03x}; cc_entrypoint=cli; "
            f"cch={rng.randrange(16**5):05x};")  # fmt: skip


def _chat(line: str, rest: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": line + "\n" + rest},
                                       {"role": "user", "content": "fix the bug"}]}  # fmt: skip


def _messages_block(line: str, rest: str) -> dict[str, Any]:
    # A block that starts with the line: vLLM drops such a block whole, so the line must move for the rest to stay.
    return {"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": line + "\n" + rest}],
            "messages": [{"role": "user", "content": "fix the bug"}]}  # fmt: skip


def _messages_string(line: str, rest: str) -> dict[str, Any]:
    # A system string is not stripped by vLLM: the line sits at the top of the prompt.
    return {"model": "m", "max_tokens": 8, "system": line + "\n" + rest,
            "messages": [{"role": "user", "content": "fix the bug"}]}  # fmt: skip


def _responses(line: str, rest: str) -> dict[str, Any]:
    return {"model": "m", "instructions": line + "\n" + rest, "input": "fix the bug"}


@pytest.mark.parametrize(("surface", "make"), [(CHAT, _chat), (MESSAGES, _messages_block),
                                               (MESSAGES, _messages_string), (RESPONSES, _responses)])  # fmt: skip
@pytest.mark.parametrize("seed", range(5))
def test_a_billing_line_whose_values_all_change_moves_by_the_third_request(surface: Surface, make: Any,
                                                                           seed: int) -> None:  # fmt: skip
    rng = random.Random(seed)
    memory = VolatilityMemory()
    moved = []
    for i in range(6):
        line = billing(rng, i)
        rest = f"Today's date: 2026-12-0{i + 1}\nSession: sess_{rng.randrange(10**8)}\n" + STATIC_SYSTEM
        out, _ = normalize(make(line, rest), surface=surface, tenant=tenant(), model=model(), memory=memory,
                           opt_out=False, now=NOW)  # fmt: skip
        text = json.dumps(out)
        moved.append(text.find("x-anthropic-billing-header") > text.find("Refunds are allowed"))
    assert moved[2:] == [True] * 4, moved  # volatile after two changes in a row, from then on at the tail
    assert not any(moved[:2])  # one change is a version bump, not volatility


def test_learning_keeps_hashes_only() -> None:
    rng = random.Random(0)
    memory = VolatilityMemory()
    for i in range(4):
        normalize(_chat(billing(rng, i), STATIC_SYSTEM), surface=CHAT, tenant=tenant(), model=model(),
                  memory=memory, opt_out=False, now=NOW)  # fmt: skip
    mem = memory.for_tenant("acme")
    for key, entry in mem._spans.items():
        assert isinstance(key, int) and all(isinstance(v, int) for v in entry)
