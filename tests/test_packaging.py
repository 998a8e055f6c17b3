"""The wheel on its own: built from the sources and installed into a fresh venv outside the checkout, `kvgate serve`
answers /health with the embedded default config from any directory, the venv holds none of the lab packages, and
the lab commands name the extra to install instead of failing with a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
LAB_ONLY = ("matplotlib", "numpy", "rich", "tokenizers")
# Installing the core dependencies from the index takes about a minute with a warm pip cache.
INSTALL_TIMEOUT_S = 900

# The module's fixtures build a wheel and a venv: more than the suite's per-test timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(INSTALL_TIMEOUT_S + 120)]


def _run(cmd: list[str | Path], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=True, timeout=timeout)


def _clean_env(cwd: Path) -> dict[str, str]:
    """The environment of a user who never saw the checkout: no KVGATE_* settings, no PYTHONPATH."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("KVGATE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env["PWD"] = str(cwd)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvgate's wheel, built from a copy of what a build reads (pyproject, README, app/), not in the checkout."""
    root = tmp_path_factory.mktemp("kvgate-wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "app", src / "app", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", root / "dist", src])
    [built] = (root / "dist").glob("kvgate-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no system site-packages) with only the wheel and its core dependencies installed."""
    path = tmp_path_factory.mktemp("kvgate-venv") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", path])
    _run([path / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel],
         timeout=INSTALL_TIMEOUT_S)
    return path


def test_wheel_carries_the_embedded_default_config(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "app/defaults/local.yaml" in names
    assert (ROOT / "config" / "local.yaml").read_text() == (ROOT / "app" / "defaults" / "local.yaml").read_text()


def test_fresh_install_serves_health_with_the_embedded_default_from_any_directory(venv: Path, tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [str(venv / "bin" / "kvgate"), "serve", "--port", str(port)],
        cwd=tmp_path, env=_clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        # The first line: ready, or (no engine runs here) listening and not ready; EOF if the process died first.
        ready = proc.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        assert ready.startswith((f"kvgate ready on {url} - pools fast (", f"kvgate listening on {url}, not ready")), (
            ready + proc.stdout.read()
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            assert resp.status == 200
            assert json.loads(resp.read()) == {"status": "ok"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_fresh_install_holds_no_lab_packages(venv: Path) -> None:
    listed = json.loads(_run([venv / "bin" / "python", "-m", "pip", "list", "--format=json"]).stdout)
    names = {p["name"].lower() for p in listed}
    assert "kvgate" in names
    assert not names & set(LAB_ONLY), sorted(names & set(LAB_ONLY))
    out = _run([venv / "bin" / "python", "-c", "import sys; print(sys.prefix, sys.base_prefix)"]).stdout.split()
    assert out[0] != out[1] and not str(venv).startswith(str(ROOT))


@pytest.mark.parametrize(("command", "args"), [("sim", ["--port", "1"]), ("bench", ["--base-url", "http://x"])])
def test_lab_command_without_its_extra_names_the_extra_and_exits_2(
    venv: Path, tmp_path: Path, command: str, args: list[str]
) -> None:
    proc = subprocess.run([str(venv / "bin" / "kvgate"), command, *args], cwd=tmp_path, env=_clean_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"pip install 'kvgate[{command}]'" in proc.stderr
    assert "Traceback" not in proc.stderr
