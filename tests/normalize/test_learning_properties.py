"""Properties of learned moves (hypothesis): templates re-rendered with fresh values on every request."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any, Literal

from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from app.normalize import BLOCK_OPEN, VolatilityMemory
from tests.normalize.helpers import run
from tests.normalize.test_properties import _FENCE_RX, PADDING, fact_lines, prose, texts

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REQUESTS = 4  # three to learn, the fourth is checked

keys = st.sampled_from(["cch", "nonce", "Ticket", "run_key", "x-req", "cc_version", "node"])
seps = st.sampled_from(["=", ": ", " = "])
joins = st.sampled_from(["; ", ", ", " "])
# A slot is "{}" (a fresh value per request) or a fixed value (static across requests).
slot = st.one_of(st.just("{}"), st.sampled_from(["2.1.3", "cli", "w-3", "7"]))
pair = st.tuples(keys, seps, slot).map(lambda t: t[0] + t[1] + t[2])
pairs_line = st.lists(pair, min_size=1, max_size=4).flatmap(lambda ps: joins.map(lambda j: j.join(ps)))
labelled = st.tuples(st.sampled_from(["x-anthropic-billing-header: ", "Ticket number: ", "- **Nonce:** "]), slot).map(
    "".join
)
learned_line = st.one_of(pairs_line, labelled)
static_line = prose.map(lambda s: s.replace("{", "(").replace("}", ")"))
fenced = st.lists(learned_line, min_size=1, max_size=3).map(lambda ls: "```\n" + "\n".join(ls) + "\n```")
quoted = learned_line.map(lambda ln: "> " + ln)
tagged = learned_line.map(lambda ln: "<example>\n" + ln + "\n</example>")
template_line = st.one_of(learned_line, learned_line, static_line, fenced, quoted, tagged, st.just(""))
template_text = st.one_of(
    st.lists(template_line, max_size=8).map("\n".join),
    st.tuples(st.lists(template_line, max_size=5), st.lists(template_line, max_size=3)).map(
        lambda t: "\n".join(t[0]) + "\n" + PADDING + "\n" + "\n".join(t[1])  # long: the cached fast path
    ),
)
values = st.lists(st.text("abcdefABCDEF0123456789", min_size=3, max_size=10), min_size=64, max_size=64, unique=True)


def render(template: str, pool: list[str], request: int) -> str:
    """The template with every `{}` filled by a value of its own for this request."""
    parts = template.split("{}")
    out = [parts[0]]
    for k, rest in enumerate(parts[1:]):
        out.extend((pool[(request * 7 + k) % len(pool)] + str(request), rest))
    return "".join(out)


def bodies(system: str, user: str, pool: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": render(system, pool, i)},
                {"role": "user", "content": render(user, pool, i + 100)},
            ],
        }
        for i in range(REQUESTS)
    ]


def learned(bodies_: list[dict[str, Any]], placement: Literal["system", "user"]) -> tuple[VolatilityMemory, Any]:
    memory = VolatilityMemory()
    for body in bodies_[:-1]:
        run(copy.deepcopy(body), memory=memory, placement=placement)
    return memory, bodies_[-1]


placements = st.sampled_from(["system", "user"])


@SETTINGS
@given(template_text, template_text, values, placements)
def test_learned_moves_are_idempotent_and_faithful(
    system: str, user: str, pool: list[str], placement: Literal["system", "user"]
) -> None:
    memory, body = learned(bodies(system, user, pool), placement)
    snapshot = copy.deepcopy(body)
    once, report = run(body, memory=memory, placement=placement)
    assert body == snapshot
    assert fact_lines(once) == fact_lines(body)  # every moved line reappears exactly once, verbatim
    assert len([t for t in texts(once) if BLOCK_OPEN in t]) == (1 if report.moved_total > report.to_head else 0)
    fences = Counter(f for t in texts(body) for f in _FENCE_RX.findall(t))
    assert Counter(f for t in texts(once) for f in _FENCE_RX.findall(t)) == fences
    twice, again = run(once, memory=memory, placement=placement)
    assert twice == once and again.moved_total == 0


@SETTINGS
@given(template_text, values)
def test_protected_learned_lines_never_move(system: str, pool: list[str]) -> None:
    memory, body = learned(bodies(system, "hi", pool), "system")
    out, _ = run(body, memory=memory)
    kept = out["messages"][0]["content"].split("\n")
    for ln in body["messages"][0]["content"].split("\n"):
        if ln.startswith(("> ", "```", "<example>")):
            assert ln in kept


@SETTINGS
@given(template_text, template_text, values)
def test_cached_fast_path_agrees_with_a_full_scan(system: str, user: str, pool: list[str]) -> None:
    cached, fresh = VolatilityMemory(), VolatilityMemory()
    for body in bodies(system, user, pool):
        a = run(copy.deepcopy(body), memory=cached)
        tm = fresh.for_tenant("acme")
        tm._shapes.clear()  # no shape: every text takes the full scan
        tm._static.clear()
        b = run(copy.deepcopy(body), memory=fresh)
        assert a == b


def test_generated_templates_do_exercise_learned_moves() -> None:
    def moves(args: tuple[str, list[str]]) -> bool:
        memory, body = learned(bodies(args[0], "hi", args[1]), "system")
        report = run(body, memory=memory)[1]
        return report.moved.get("learned", 0) >= 2 and len(body["messages"][0]["content"]) > 512

    quick = settings(max_examples=500, deadline=None, database=None, phases=[Phase.generate])  # no shrinking
    example = find(st.tuples(template_text, values), moves, settings=quick)
    assert moves(example)
