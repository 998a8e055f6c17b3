"""ChatML rendering keeps message order as token order, as SmolLM2's template does."""

from __future__ import annotations

import pytest

from app.sim.template import SMOLLM2_DEFAULT_SYSTEM, TemplateError, render_chat


def test_turns_render_in_message_order_with_a_generation_prompt() -> None:
    text = render_chat([{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                        {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"}])
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n"
    )


def test_default_system_turn_is_inserted_only_without_a_system_message() -> None:
    assert render_chat([{"role": "user", "content": "U"}]).startswith(
        f"<|im_start|>system\n{SMOLLM2_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nU"
    )
    assert render_chat([{"role": "user", "content": "U"}], default_system=None).startswith("<|im_start|>user\n")


def test_a_later_turn_changes_only_the_tail_of_the_prompt() -> None:
    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    short = render_chat(history, add_generation_prompt=False)
    longer = render_chat([*history, {"role": "assistant", "content": "A"}])
    assert longer.startswith(short)


def test_tools_render_in_the_system_turn_keeping_the_clients_key_order() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}
    text = render_chat([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], tools=[tool])
    system_turn = text.split("<|im_end|>")[0]
    assert '{"name":"f","parameters":{"b":1,"a":2}}' in system_turn


def test_text_parts_are_joined_and_other_parts_are_refused() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert "a\nb" in render_chat([{"role": "user", "content": parts}])
    with pytest.raises(TemplateError):
        render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
