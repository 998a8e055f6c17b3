"""Chat templates run as transformers runs them: the sandbox (memoized) and vLLM's message shapes."""

from __future__ import annotations

import jinja2.exceptions
import pytest

from app.kvcache.chat_template import compile_template, template_messages


def test_the_memoized_sandbox_still_refuses_unsafe_attributes_and_mutation() -> None:
    tpl = compile_template("{{ messages[0].content.upper() }}|{{ messages.__class__.__name__ }}")
    for _ in range(2):  # the second render answers from the memoized verdicts
        with pytest.raises(jinja2.exceptions.SecurityError):
            tpl.render(messages=[{"content": "a"}])
    mutate = compile_template("{{ messages.append(1) }}")
    for _ in range(2):
        with pytest.raises(jinja2.exceptions.SecurityError):
            mutate.render(messages=[])
    safe = compile_template("{% for m in messages %}{{ loop.first }}{{ m.content.upper() }}{% endfor %}")
    assert [safe.render(messages=[{"content": "a"}, {"content": "b"}]) for _ in range(2)] == ["TrueAFalseB"] * 2


def test_tool_call_arguments_become_objects_and_developer_becomes_system() -> None:
    msgs = template_messages(
        [
            {"role": "developer", "content": "d"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
            {"role": "assistant", "content": "x", "tool_calls": []},
        ]
    )
    assert msgs[0]["role"] == "system"
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert "tool_calls" not in msgs[2]


def test_messages_that_need_no_change_are_handed_over_uncopied() -> None:
    plain = {"role": "user", "content": "x"}
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    out = template_messages([plain, parts, {"role": "developer", "content": "d"}])
    assert out[0] is plain
    assert out[1] == {"role": "user", "content": "a\nb"} and parts["content"][0] == {"type": "text", "text": "a"}
    assert out[2] == {"role": "system", "content": "d"}
