"""app/cancel.py: a stop ends even when something under a background task swallows its cancellation."""

from __future__ import annotations

import asyncio

import pytest

from app.cancel import cancel_and_wait, raise_if_cancelled


async def _swallowing_loop(rounds: list[int], check: bool, honest: asyncio.Event | None = None) -> None:
    # What redis-py did to the peer-load loop: the in-flight call absorbs the CancelledError and returns.
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if honest is not None and honest.is_set():
                raise
        rounds.append(1)
        if check:
            raise_if_cancelled()


async def test_raise_if_cancelled_ends_a_loop_whose_call_swallowed_the_cancel() -> None:
    rounds: list[int] = []
    task = asyncio.create_task(_swallowing_loop(rounds, check=True))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert task.cancelled()


async def test_cancel_and_wait_cancels_again_until_a_twice_swallowing_task_ends() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 3:
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), 10)
    assert task.cancelled() and swallowed == 3


async def test_cancel_and_wait_gives_up_after_its_bound_and_returns() -> None:
    rounds: list[int] = []
    honest = asyncio.Event()
    task = asyncio.create_task(_swallowing_loop(rounds, check=False, honest=honest))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, bound_s=0.3), 10)
    assert not task.done()  # left running, logged; the caller's stop went on
    n = len(rounds)
    await asyncio.sleep(0.05)
    assert len(rounds) > n
    honest.set()  # the test's own clean-up
    await asyncio.wait_for(cancel_and_wait(task), 10)
    assert task.cancelled()


async def test_cancel_and_wait_does_not_swallow_the_callers_own_cancel() -> None:
    honest = asyncio.Event()
    inner = asyncio.create_task(_swallowing_loop([], check=False, honest=honest))
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait(inner, bound_s=60))
    await asyncio.sleep(0.05)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert not inner.done()
    honest.set()
    await asyncio.wait_for(cancel_and_wait(inner), 10)
