from __future__ import annotations

from typing import Any

from app.prefix_key import CHUNK_CHARS, PREFIX_CHUNKS, routing_key
from app.surfaces import CHAT, COMPLETIONS, EMBEDDINGS

_SURFACES = {"chat": CHAT, "text_completion": COMPLETIONS, "embeddings": EMBEDDINGS}


def key(body: dict[str, Any], operation: str, salt: str) -> int:
    """The routing key as the pipeline computes it: the surface's view, then the hash."""
    return routing_key(_SURFACES[operation].view(body).key_head, salt)

SYSTEM = "You are the support assistant of Example Corp. Answer briefly and cite the manual. " * 20
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def chat(*messages: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages], **extra}


def test_turns_of_one_session_share_a_key() -> None:
    turn1 = chat(("system", "Be terse."), ("user", "How do I reset my router? " * 5))
    turn3 = chat(
        ("system", "Be terse."),
        ("user", "How do I reset my router? " * 5),
        ("assistant", "Hold the button for ten seconds."),
        ("user", "It did not work."),
        ("assistant", "Unplug it."),
        ("user", "Now what?"),
    )
    assert key(turn1, "chat", "salt") == key(turn3, "chat", "salt")


def test_sessions_with_a_short_system_prompt_get_different_keys() -> None:
    a = chat(("system", "Be terse."), ("user", "How do I reset my router? " * 5))
    b = chat(("system", "Be terse."), ("user", "Which plan includes roaming abroad? " * 5))
    assert key(a, "chat", "salt") != key(b, "chat", "salt")


def test_different_long_system_prompts_get_different_keys() -> None:
    other = "You are the billing assistant of Example Corp. Never discuss refunds over 100 EUR. " * 20
    a = chat(("system", SYSTEM), ("user", "hi"))
    b = chat(("system", other), ("user", "hi"))
    assert key(a, "chat", "s") != key(b, "chat", "s")


def test_content_beyond_the_window_does_not_change_the_key() -> None:
    window = CHUNK_CHARS * PREFIX_CHUNKS
    a = chat(("system", SYSTEM[:window] + "tail A"), ("user", "first question"))
    b = chat(("system", SYSTEM[:window] + "tail B"), ("user", "another question"), tools=TOOLS)
    assert key(a, "chat", "s") == key(b, "chat", "s")


def test_only_whole_chunks_count() -> None:
    base = "x" * (CHUNK_CHARS * 3)
    a = {"prompt": base + "abc"}
    b = {"prompt": base + "xyz"}
    c = {"prompt": base[:-1] + "y"}
    assert key(a, "text_completion", "s") == key(b, "text_completion", "s")
    assert key(a, "text_completion", "s") != key(c, "text_completion", "s")


def test_tenant_salt_separates_identical_prompts() -> None:
    body = chat(("system", SYSTEM), ("user", "hi"))
    assert key(body, "chat", "tenant-a") != key(body, "chat", "tenant-b")


def test_tools_are_part_of_the_key_after_a_short_system_prompt() -> None:
    other_tools = [{"type": "function", "function": {"name": "refund", "parameters": {"type": "object"}}}]
    a = chat(("system", "Use tools." * 10), ("user", "q" * 200), tools=TOOLS)
    b = chat(("system", "Use tools." * 10), ("user", "q" * 200), tools=other_tools)
    assert key(a, "chat", "s") != key(b, "chat", "s")


def test_content_parts_key_like_plain_text() -> None:
    text = "Describe the attached picture in detail. " * 4
    parts = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": "data:..."}}]
    assert key(chat(("user", text)), "chat", "s") == key(chat(("user", parts)), "chat", "s")


def test_token_prompts_are_block_aligned_by_sixteen_tokens() -> None:
    head = list(range(1000, 1032))
    a = {"prompt": [*head, 1, 2, 3]}
    b = {"prompt": [*head, 7, 8]}
    c = {"prompt": [*head[:-1], 5, 1, 2, 3]}
    assert key(a, "text_completion", "s") == key(b, "text_completion", "s")
    assert key(a, "text_completion", "s") != key(c, "text_completion", "s")


def test_batch_prompt_keys_on_its_first_prompt() -> None:
    first = "Translate to French: " * 10
    assert key({"prompt": [first, "zzz" * 100]}, "text_completion", "s") == key(
        {"prompt": first}, "text_completion", "s"
    )


def test_embeddings_key_on_input() -> None:
    a = {"input": "a" * 200}
    b = {"input": "b" * 200}
    assert key(a, "embeddings", "s") != key(b, "embeddings", "s")


def test_malformed_bodies_still_get_a_key() -> None:
    for body in ({}, {"messages": "nope"}, {"messages": [1, None, {"role": ["x"]}, {"role": "user"}]}, {"prompt": 5}):
        assert isinstance(key(body, "chat", "s"), int)
        assert isinstance(key(body, "text_completion", "s"), int)
