"""app/hooks.py: which hooks run at a point, and the dispatcher's after_pick runner."""

from __future__ import annotations

from typing import Any

from app.hooks import Hooks, PathHook


class _Picks(PathHook):
    def __init__(self, seen: list[str], name: str) -> None:
        self.seen = seen
        self.name = name

    def after_pick(self, ctx: Any) -> None:
        self.seen.append(self.name)


class _SettlesOnly(PathHook):
    async def before_settle(self, ctx: Any) -> None:
        """Overrides another point only."""


def test_a_point_holds_only_the_hooks_that_override_it() -> None:
    seen: list[str] = []
    hooks = Hooks.of([_SettlesOnly(), _Picks(seen, "a")])
    assert len(hooks.after_pick) == 1 and len(hooks.before_settle) == 1 and hooks.before_pick == ()


def test_the_after_pick_runner_is_the_single_hook_itself() -> None:
    seen: list[str] = []
    hooks = Hooks.of([_SettlesOnly(), _Picks(seen, "a")])
    runner = hooks.after_pick_runner()
    assert runner == hooks.after_pick[0]
    runner(None)  # type: ignore[arg-type]
    assert seen == ["a"]


def test_the_after_pick_runner_runs_several_hooks_in_registration_order_and_none_without_error() -> None:
    seen: list[str] = []
    Hooks.of([_Picks(seen, "a"), _Picks(seen, "b")]).after_pick_runner()(None)  # type: ignore[arg-type]
    Hooks.of([]).after_pick_runner()(None)  # type: ignore[arg-type]
    assert seen == ["a", "b"]
