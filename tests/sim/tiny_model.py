"""A tiny HF-style model folder for tests: a byte-level BPE tokenizer.json trained on a few strings + a ChatML template.

Byte-level BPE encodes any text, so prompts need not come from the training strings; the special tokens are
added tokens, as in SmolLM2, so app.kvcache.tokens splits on them the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a tiny test model."
    "{% if tools %} Tools: {{ tools | tojson }}{% endif %}<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "Fact 1: item 1 weighs 7 grams. Fact 2: item 2 weighs 14 grams.",
    "You are a tiny test model. Answer briefly and well.",
    "hello there, how are you today? I am fine, thank you very much.",
]


def build_tiny_model(folder: Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `folder`; return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>"})
    )
    return folder
