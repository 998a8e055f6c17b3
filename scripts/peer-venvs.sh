#!/usr/bin/env bash
# Venvs for the peer tools the benchmarks compare against, kept outside the
# checkout so their dependency trees never touch the project's own venv:
#   litellm   LiteLLM proxy (experiments/peers.py runs it as a third proxy)
#   guidellm  vLLM's GuideLLM (experiments/guidellm_crosscheck.py cross-checks `kvgate bench`)
#   vllm-router   vLLM's Rust router (experiments/kv_routing_eval.py: its cache_aware policy)
#   sglang-router SGLang's Rust router (experiments/kv_routing_eval.py: its cache_aware policy)
# Every subcommand is idempotent: a marker records the pinned versions, so a
# bumped pin rebuilds and an unchanged one returns at once.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/peer-venvs.sh <litellm|guidellm|vllm-router|sglang-router|all|path NAME>

  litellm   create $KVGATE_CACHE/litellm-venv with the pinned litellm[proxy]
  guidellm  create $KVGATE_CACHE/guidellm-venv with CPU torch + pinned guidellm
  vllm-router    create $KVGATE_CACHE/vllm-router-venv with the pinned vllm-router (binary wheel)
  sglang-router  create $KVGATE_CACHE/sglang-router-venv with the pinned sglang-router (binary wheel)
  all       all four
  path NAME print the venv folder of NAME (litellm|guidellm|vllm-router|sglang-router)

environment:
  KVGATE_CACHE   cache root (default: $HOME/.cache/kvgate)
  KVGATE_PYTHON  interpreter the venvs are built from (default: python3.11)
EOF
}

CACHE="${KVGATE_CACHE:-$HOME/.cache/kvgate}"
BASE_PYTHON="${KVGATE_PYTHON:-python3.11}"

# Newer releases pin litellm-proxy / litellm-enterprise / litellm-proxy-extras builds the package index here
# does not carry (1.110: litellm-proxy; 1.108-1.109: enterprise .post2, extras 0.4.113); 1.106.12 resolves.
LITELLM_SPEC="litellm[proxy]==1.106.12"
# torch first: the CPU build is a local wheel; resolving torch inside the
# guidellm install could pick a much larger CUDA build.
TORCH_SPEC="torch==2.13.0"
GUIDELLM_SPEC="guidellm==0.8.1"
# The Rust routers ship abi3 manylinux wheels: nothing is compiled here.
VLLM_ROUTER_SPEC="vllm-router==0.1.17"
SGLANG_ROUTER_SPEC="sglang-router==0.3.2"

log() { printf '[peer-venvs] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# make_venv NAME STAMP CHECK SPEC... : build $CACHE/NAME-venv unless its marker equals STAMP.
make_venv() {
  local name="$1" stamp="$2" check="$3"
  shift 3
  local venv="$CACHE/$name-venv" marker="$CACHE/$name-venv/.kvgate-install-complete"
  if [[ -f "$marker" && "$(cat "$marker")" == "$stamp" ]]; then
    log "$name venv ready: $venv"
    return 0
  fi
  local t0=$SECONDS
  mkdir -p "$CACHE"
  [[ -x "$venv/bin/python" ]] || "$BASE_PYTHON" -m venv "$venv"
  local spec
  for spec in "$@"; do
    # One install per spec, in order, so an earlier pin (torch) is in place
    # before a later package's resolver runs.
    "$venv/bin/python" -m pip install --no-input --progress-bar off "$spec"
  done
  "$venv/bin/python" -c "$check"
  printf '%s' "$stamp" >"$marker"
  log "$name venv built in $((SECONDS - t0)) s: $venv"
}

cmd_litellm() {
  make_venv litellm "$LITELLM_SPEC v1" \
    'import litellm, importlib.metadata as m; print("litellm", m.version("litellm"))' \
    "$LITELLM_SPEC"
}

cmd_guidellm() {
  make_venv guidellm "$TORCH_SPEC $GUIDELLM_SPEC v1" \
    'import guidellm, torch, importlib.metadata as m; print("guidellm", m.version("guidellm"), "torch", torch.__version__)' \
    "$TORCH_SPEC" "$GUIDELLM_SPEC"
}

cmd_vllm_router() {
  PIP_ONLY_BINARY=:all: make_venv vllm-router "$VLLM_ROUTER_SPEC v1" \
    'import importlib.metadata as m; print("vllm-router", m.version("vllm-router"))' \
    "$VLLM_ROUTER_SPEC"
}

cmd_sglang_router() {
  PIP_ONLY_BINARY=:all: make_venv sglang-router "$SGLANG_ROUTER_SPEC v1" \
    'import importlib.metadata as m; print("sglang-router", m.version("sglang-router"))' \
    "$SGLANG_ROUTER_SPEC"
}

case "${1:-}" in
  litellm) cmd_litellm ;;
  guidellm) cmd_guidellm ;;
  vllm-router) cmd_vllm_router ;;
  sglang-router) cmd_sglang_router ;;
  all) cmd_litellm; cmd_guidellm; cmd_vllm_router; cmd_sglang_router ;;
  path)
    case "${2:-}" in
      litellm | guidellm | vllm-router | sglang-router) ;;
      *) die "path needs litellm, guidellm, vllm-router or sglang-router" ;;
    esac
    printf '%s\n' "$CACHE/$2-venv" ;;
  -h | --help | help) usage ;;
  *) usage; exit 2 ;;
esac
