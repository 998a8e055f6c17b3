#!/usr/bin/env bash
# Venvs for the peer tools the benchmarks compare against, kept outside the
# checkout so their dependency trees never touch the project's own venv:
#   litellm   LiteLLM proxy (experiments/peers.py runs it as a third proxy)
#   guidellm  vLLM's GuideLLM (experiments/guidellm_crosscheck.py cross-checks `kvgate bench`)
# Every subcommand is idempotent: a marker records the pinned versions, so a
# bumped pin rebuilds and an unchanged one returns at once.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/peer-venvs.sh <litellm|guidellm|all|path NAME>

  litellm   create $KVGATE_CACHE/litellm-venv with the pinned litellm[proxy]
  guidellm  create $KVGATE_CACHE/guidellm-venv with CPU torch + pinned guidellm
  all       both
  path NAME print the venv folder of NAME (litellm|guidellm)

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

case "${1:-}" in
  litellm) cmd_litellm ;;
  guidellm) cmd_guidellm ;;
  all) cmd_litellm; cmd_guidellm ;;
  path)
    [[ "${2:-}" == litellm || "${2:-}" == guidellm ]] || die "path needs litellm or guidellm"
    printf '%s\n' "$CACHE/$2-venv" ;;
  -h | --help | help) usage ;;
  *) usage; exit 2 ;;
esac
