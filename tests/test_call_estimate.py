"""Cost before the call: the post-pick estimate (exact prompt, predicted cache hit) and the TPM reservation it moves."""

from __future__ import annotations

from typing import Any

import pytest

from app.call_estimate import CallEstimate, estimate_call
from app.context import Usage
from app.errors import GatewayError
from app.limits import Limiter, tpm_tokens
from app.records import PromptBlocks
from app.store.base import Release, SpendRecord, Store, StoreUnavailable
from app.store.memory import MemoryStore
from tests.store.helpers import make_ctx, tenant_of


def chat(max_tokens: int) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


def limiter(store: Store) -> Limiter:
    return Limiter(store, "open")


def test_without_hashed_blocks_the_estimate_is_the_limits_stages_and_nothing_is_cached() -> None:
    ctx = make_ctx(body=chat(64))
    ctx.estimated_input_tokens = 9
    assert estimate_call(ctx) == CallEstimate(prompt_tokens=9, cached_tokens=0, output_tokens=64, exact=False)


def test_after_a_kv_events_pick_the_prompt_is_exact_and_the_predicted_hit_is_cached() -> None:
    ctx = make_ctx(body=chat(64))
    ctx.estimated_input_tokens = 9
    ctx.blocks = PromptBlocks(n_tokens=1100, hashes=[1, 2, 3])
    assert ctx.route is not None
    ctx.route.cached_tokens = 1024
    assert estimate_call(ctx) == CallEstimate(1100, 1024, 64, True)


def test_a_cached_token_counts_its_weight_in_the_tpm_window() -> None:
    assert tpm_tokens(1100, 1024, 64, 1.0) == 1164  # OpenAI: every prompt token counts
    assert tpm_tokens(1100, 1024, 64, 0.0) == 140  # cache reads do not count
    assert tpm_tokens(1100, 1024, 64, 0.5) == 652
    assert tpm_tokens(10, 50, 0, 0.0) == 0  # cached never exceeds the prompt


async def test_the_reservation_moves_to_the_estimate_before_the_call_and_frees_the_window(any_store: Store) -> None:
    acme = tenant_of(tpm=1000, tpm_cached_weight=0.0)
    lim = limiter(any_store)
    first = make_ctx(acme, body=chat(900))
    admission = await lim.admit(first)
    with pytest.raises(GatewayError):
        await lim.admit(make_ctx(acme, body=chat(600)))
    # The pick found 592 of the 600 prompt tokens cached and the output is capped at 300 by now.
    lim.reserve_estimate(admission, CallEstimate(600, 592, 300, True))
    assert admission.tokens_reserved == 308 and admission.correction is not None
    await admission.correction
    await lim.admit(make_ctx(acme, body=chat(600)))


async def test_settle_after_a_moved_reservation_charges_the_actual_weighted_usage(any_store: Store) -> None:
    acme = tenant_of(tpm=1000, tpm_cached_weight=0.0)
    lim = limiter(any_store)
    ctx = make_ctx(acme, body=chat(900))
    admission = await lim.admit(ctx)
    lim.reserve_estimate(admission, CallEstimate(600, 592, 300, True))
    ctx.usage = Usage(prompt_tokens=600, cached_tokens=592, completion_tokens=30, reported=True)
    await lim.settle(ctx, admission)  # waits for the move, then corrects 308 → 38
    await lim.admit(make_ctx(acme, body=chat(900)))


async def test_settle_waits_for_a_failed_move_and_corrects_from_what_the_window_holds() -> None:
    class FirstWriteFails(MemoryStore):
        writes = 0

        async def settle(self, release: Release | None, spend: SpendRecord | None) -> None:
            self.writes += 1
            if self.writes == 1:
                raise StoreUnavailable("blip")
            await super().settle(release, spend)

    acme = tenant_of(tpm=1000, tpm_cached_weight=0.0)
    lim = limiter(FirstWriteFails())
    ctx = make_ctx(acme, body=chat(900))
    admission = await lim.admit(ctx)
    lim.reserve_estimate(admission, CallEstimate(600, 592, 300, True))
    ctx.usage = Usage(prompt_tokens=600, cached_tokens=592, completion_tokens=30, reported=True)
    await lim.settle(ctx, admission)  # the move failed: 905 → 38, not 308 → 38
    await lim.admit(make_ctx(acme, body=chat(900)))


async def test_an_estimate_equal_to_the_reservation_costs_no_store_write() -> None:
    lim = limiter(MemoryStore())
    ctx = make_ctx(tenant_of(tpm=1000), body=chat(64))
    admission = await lim.admit(ctx)
    lim.reserve_estimate(admission, estimate_call(ctx))
    assert admission.correction is None


async def test_a_move_the_store_could_not_take_leaves_the_reservation_where_the_window_has_it() -> None:
    class Down(MemoryStore):
        async def settle(self, release: Release | None, spend: SpendRecord | None) -> None:
            raise StoreUnavailable("down")

    lim = limiter(Down())
    admission = await lim.admit(make_ctx(tenant_of(tpm=1000, tpm_cached_weight=0.0), body=chat(900)))
    reserved = admission.tokens_reserved
    lim.reserve_estimate(admission, CallEstimate(600, 592, 300, True))
    assert admission.correction is not None
    await admission.correction
    assert admission.tokens_reserved == reserved


async def test_an_unlimited_tenant_has_no_reservation_to_move() -> None:
    lim = limiter(MemoryStore())
    admission = await lim.admit(make_ctx(body=chat(900)))
    lim.reserve_estimate(admission, CallEstimate(600, 592, 300, True))
    assert admission.correction is None and admission.tokens_reserved == 0
