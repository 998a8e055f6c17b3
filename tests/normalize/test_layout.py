"""Where the head block goes in the first user turn, and in which order its pieces are (app/normalize/layout.py)."""

from __future__ import annotations

from app.normalize.layout import head_order
from app.normalize.layout import shared_preamble as preamble
from app.normalize.transient import Transient

SKILLS = "<system-reminder>\nThe following skills are available for use with the Skill tool.\n</system-reminder>"
TOOLS = "<system-reminder>\nThe following tools are reachable through `tool_search`.\n</system-reminder>"
ENV = ("<system-reminder>\nThis is the Qwen Code. Today's date is Thursday, December 3, 2026.\n"
       "I'm currently working in the directory: /home/dev/work/inventory\n</system-reminder>")
DATE = "<system-reminder>\nThe current date is: Thursday, December 3, 2026.\n</system-reminder>"
TEXT = "Turn 1: look at the project with the shell."
DIRS = ["/home/dev/work/inventory", "-home-dev-work-inventory"]


def shared_preamble(parts: list[tuple[int, str, bool]], dirs: list[str]) -> tuple[int, ...]:
    return preamble(parts, dirs, Transient(64))


def parts(*texts: str) -> list[tuple[int, str, bool]]:
    return [(i, t, False) for i, t in enumerate(texts)]


def test_qwen_codes_shared_reminders_go_before_the_head_block_in_their_order() -> None:
    # [skills, environment, deferred tools, date, words] → skills and tools first, then the head block.
    assert shared_preamble(parts(SKILLS, ENV, TOOLS, DATE, TEXT), DIRS) == (0, 2)


def test_a_reminder_with_a_date_a_working_directory_or_a_volatile_line_is_not_shared() -> None:
    # Claude Code's first part is its `# currentDate` reminder: the head block stays first.
    assert shared_preamble(parts(DATE, SKILLS, TEXT), DIRS) == (1,)
    cwd = "<system-reminder>\nProject: /home/dev/work/inventory\n</system-reminder>"
    assert shared_preamble(parts(cwd, TEXT), DIRS) == ()
    assert shared_preamble([(0, SKILLS, True), (1, TEXT, False)], DIRS) == ()


def test_only_the_leading_run_of_reminder_parts_is_looked_at() -> None:
    # The user's own words end it (a reminder after them stays after them), and so does a part that is no text.
    assert shared_preamble(parts(TEXT, SKILLS), DIRS) == ()
    assert shared_preamble([(0, SKILLS, False), (2, TOOLS, False)], DIRS) == (0,)


def test_a_shared_reminder_does_not_move_ahead_of_one_that_refers_to_it_by_position() -> None:
    refers = "<system-reminder>\nDecember 3, 2026: use the date above, not your own.\n</system-reminder>"
    assert shared_preamble(parts(SKILLS, ENV, TOOLS), DIRS) == (0, 2)
    assert shared_preamble(parts(SKILLS, refers, TOOLS), DIRS) == (0,)


def test_the_head_block_puts_git_snapshots_last_and_keeps_the_clients_order_otherwise() -> None:
    git = "gitStatus: snapshot\n\nCurrent branch: main\n\nStatus:\n(clean)"
    memory, env = "# auto memory\n`/home/dev/.qwen/projects/-home-dev-work-inventory/memory`", "# Environment\ncwd"
    assert head_order([git, memory, env]) == [memory, env, git]
    assert head_order([memory, env, git]) == [memory, env, git]
