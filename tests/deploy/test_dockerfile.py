"""The gateway image: slim, non-root, a /health healthcheck, no build tools in the final stage, and the
config path and port compose relies on."""

from __future__ import annotations

import re
import subprocess

import yaml

from app.config import parse_config
from tests.deploy.files import COMPOSE, COMPOSE_CPU, ROOT, effective_compose, flag

DOCKERFILE = (ROOT / "Dockerfile").read_text()
# Instructions with continuation lines joined, comments dropped.
LINES = [
    ln.strip() for ln in re.sub(r"\\\n", " ", DOCKERFILE).splitlines() if ln.strip() and not ln.strip().startswith("#")
]
STAGES: list[list[str]] = []
for _ln in LINES:
    if _ln.upper().startswith("FROM "):
        STAGES.append([])
    if STAGES:
        STAGES[-1].append(_ln)
FINAL = STAGES[-1]


def _instr(name: str) -> list[str]:
    return [ln.split(None, 1)[1] for ln in FINAL if ln.split(None, 1)[0].upper() == name]


def test_final_stage_is_slim_python_and_copies_only_the_built_venv() -> None:
    assert len(STAGES) >= 2, "multi-stage build expected"
    base = FINAL[0].split()[1]
    arg = re.search(rf"ARG {re.escape(base.strip('${}'))}=(\S+)", DOCKERFILE)
    image = arg.group(1) if arg else base
    assert "slim" in image and ":" in image
    copies = _instr("COPY")
    assert all(c.startswith("--from=build ") or c.startswith("config/") for c in copies), copies


def test_final_stage_installs_no_build_tools() -> None:
    runs = " ".join(_instr("RUN"))
    for tool in ("apt-get", "apk ", "gcc", "build-essential", "pip install", "make "):
        assert tool not in runs


def test_runs_as_non_root() -> None:
    [user] = _instr("USER")
    assert user.split(":")[0] not in ("root", "0")


def test_healthcheck_probes_health_on_the_configured_port() -> None:
    cfg = parse_config(yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text()))
    [hc] = _instr("HEALTHCHECK")
    assert f"127.0.0.1:{cfg.listen.port}/health" in hc
    assert str(cfg.listen.port) in _instr("EXPOSE")[0].split()


def test_image_command_matches_the_compose_mount() -> None:
    gw = effective_compose(COMPOSE)["services"]["gateway"]
    [cmd] = _instr("CMD")
    argv = yaml.safe_load(cmd)
    assert argv == gw["command"]
    target = flag(argv, "--config")
    assert any(v.split(":")[1] == target for v in gw["volumes"])


def test_build_context_keeps_out_the_venv_git_and_tests() -> None:
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") if "*" in ignore else 0] == "*", "allow-list style: ignore everything first"
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    assert {"pyproject.toml", "app"} <= allowed and not allowed & {".venv", ".git", "tests"}
    for c in [ln for st in STAGES for ln in st if ln.upper().startswith("COPY ") and "--from" not in ln]:
        for src in c.split()[1:-1]:
            assert src.rstrip("/") in allowed, f"COPY {src} is excluded by .dockerignore"


def test_image_installs_the_core_only_unless_asked() -> None:
    build = " ".join(STAGES[0])
    assert re.search(r'\bARG EXTRAS(="")?(\s|$)', build), "EXTRAS must default to empty"
    [target] = re.findall(r"pip install (\S+) ", build.replace("--no-deps .", ""))
    # The target as the build stage's sh expands it: no extras by default, `.[sim]` for EXTRAS=sim.
    for extras, want in (("", "."), ("sim", ".[sim]")):
        out = subprocess.run(["sh", "-c", f"echo {target}"], env={"EXTRAS": extras}, capture_output=True, text=True)
        assert out.stdout.strip() == want
    gw = effective_compose(COMPOSE)["services"]["gateway"]
    assert not (gw["build"].get("args") or {}).get("EXTRAS"), "the production gateway image has no extras"


def test_cpu_stack_images_carry_the_lab_extras_under_their_own_tag() -> None:
    prod = effective_compose(COMPOSE)["services"]["gateway"]["image"]
    cpu = effective_compose(COMPOSE, COMPOSE_CPU)["services"]
    sims = [name for name, svc in cpu.items() if svc.get("command", [])[:2] == ["kvgate", "sim"]]
    assert sims
    extras = cpu["gateway"]["build"]["args"]["EXTRAS"].split(",")
    assert {"sim", "bench"} <= set(extras), "kvgate sim and bench (docs/deploy.md) need their extras"
    assert cpu["gateway"]["image"] != prod, "a sim-extra build must not reuse the core image's tag"
    for name in sims:
        assert cpu[name]["image"] == cpu["gateway"]["image"], f"{name}: runs the gateway's lab image"


def test_one_build_per_image_and_no_pull_of_an_image_compose_builds() -> None:
    for files in ((COMPOSE,), (COMPOSE, COMPOSE_CPU)):
        services = effective_compose(*files)["services"]
        built = [name for name, svc in services.items() if "build" in svc]
        assert len({services[n]["image"] for n in built}) == len(built), f"{files}: an image is built twice"
        for name, svc in services.items():
            if name in built:
                assert svc.get("pull_policy") == "build", f"{name}: built here, never pulled"
            elif any(svc["image"] == services[b]["image"] for b in built):
                assert svc.get("pull_policy") == "never", f"{name}: runs an image compose builds; never pull it"
