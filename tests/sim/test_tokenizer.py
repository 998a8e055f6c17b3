"""The fallback tokenizer is deterministic and offline; a real tokenizer.json is used when given."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.sim.tokenizer import FallbackTokenizer, load_tokenizer

SMOLLM2 = Path.home() / ".cache/kvgate/models/smollm2-135m/tokenizer.json"


def test_fallback_is_stable_across_instances_and_maps_chatml_markers_to_single_ids() -> None:
    text = "<|im_start|>user\nHello, world! 12345<|im_end|>\n"
    a, b = FallbackTokenizer().encode(text), FallbackTokenizer().encode(text)
    assert a == b
    assert a[0] == 1 and 2 in a  # <|im_start|>, <|im_end|> as SmolLM2 numbers them


def test_fallback_token_count_grows_with_text_and_a_changed_word_changes_one_id() -> None:
    tok = FallbackTokenizer()
    one, two = tok.encode("the quick brown fox"), tok.encode("the quick green fox")
    assert len(one) == len(two) == 4
    assert [x == y for x, y in zip(one, two, strict=True)] == [True, True, False, True]


def test_output_vocab_tokens_encode_to_themselves() -> None:
    tok = FallbackTokenizer()
    for tid, text in tok.output_vocab()[:20]:
        assert tok.encode(text) == [tid]


@pytest.mark.skipif(not SMOLLM2.exists(), reason="SmolLM2 tokenizer.json not fetched (scripts/vllm-cpu.sh model)")
def test_real_tokenizer_json_is_used_when_given() -> None:
    tok = load_tokenizer(SMOLLM2)
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1
    for tid, text in tok.output_vocab()[:20]:
        assert tok.encode(text) == [tid]
